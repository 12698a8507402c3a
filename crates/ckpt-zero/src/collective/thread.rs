//! [`ThreadGroup`]: a group whose ranks are threads of one process.
//!
//! Every ordered pair of ranks has its own bounded crossbeam channel, so memory in flight is
//! bounded (`CHANNEL_FRAMES` frames of at most [`CHUNK_SIZE`](super::CHUNK_SIZE) bytes per pair)
//! and waiting blocks on the channel with a deadline instead of spinning. When a member is
//! dropped (its thread returned or panicked), its channel ends are dropped and its peers get
//! [`CollectiveError::PeerGone`](super::CollectiveError::PeerGone) instead of waiting for the
//! timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{
    Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError, bounded,
};

use super::engine::{Engine, Frame, Link, LinkError, delegate_collective};
use super::{Collective, CollectiveError, Result};

/// Capacity, in frames, of the channel between two ranks.
const CHANNEL_FRAMES: usize = 2;

/// One rank's member of an in-process group of threads.
///
/// Create all members at once with [`ThreadGroup::new`] and move each into its thread.
pub struct ThreadGroup {
    engine: Engine<ChannelLink>,
}

impl ThreadGroup {
    /// Creates a group of `size` ranks; member `i` of the returned vector is rank `i`.
    /// `timeout` bounds every wait for a peer. `size == 0` gives an empty vector.
    pub fn new(size: usize, timeout: Duration) -> Vec<ThreadGroup> {
        let mut senders: Vec<Vec<Option<Sender<Frame>>>> = (0..size)
            .map(|_| (0..size).map(|_| None).collect())
            .collect();
        let mut receivers: Vec<Vec<Option<Receiver<Frame>>>> = (0..size)
            .map(|_| (0..size).map(|_| None).collect())
            .collect();
        for src in 0..size {
            for dst in (0..size).filter(|&d| d != src) {
                let (tx, rx) = bounded(CHANNEL_FRAMES);
                senders[src][dst] = Some(tx);
                receivers[dst][src] = Some(rx);
            }
        }
        let registry = Arc::new(SplitRegistry::default());
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (tx, rx))| ThreadGroup {
                engine: Engine::new(
                    ChannelLink {
                        rank,
                        size,
                        tx,
                        rx,
                        registry: Arc::clone(&registry),
                        splits: 0,
                    },
                    timeout,
                ),
            })
            .collect()
    }
}

delegate_collective!(ThreadGroup);

/// Groups created by `split`, shared by the members of one group. The `k`-th split of every
/// member refers to the same child group: the first member to get there creates all its
/// members, each member takes its own, and the entry is removed once all are taken.
#[derive(Default)]
struct SplitRegistry {
    pending: Mutex<HashMap<u64, Vec<Option<ThreadGroup>>>>,
}

struct ChannelLink {
    rank: usize,
    size: usize,
    /// `tx[dst]`: channel to `dst` (`None` for self).
    tx: Vec<Option<Sender<Frame>>>,
    /// `rx[src]`: channel from `src` (`None` for self).
    rx: Vec<Option<Receiver<Frame>>>,
    registry: Arc<SplitRegistry>,
    splits: u64,
}

impl ChannelLink {
    fn peer_error(&self, peer: usize) -> LinkError {
        LinkError::Backend(format!("rank {} has no channel to rank {peer}", self.rank))
    }
}

impl Link for ChannelLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(
        &mut self,
        dst: usize,
        frame: Frame,
        deadline: Instant,
    ) -> std::result::Result<(), LinkError> {
        let tx = self
            .tx
            .get(dst)
            .and_then(Option::as_ref)
            .ok_or_else(|| self.peer_error(dst))?;
        tx.send_deadline(frame, deadline).map_err(|e| match e {
            SendTimeoutError::Timeout(_) => LinkError::Timeout,
            SendTimeoutError::Disconnected(_) => LinkError::Gone,
        })
    }

    fn recv(&mut self, src: usize, deadline: Instant) -> std::result::Result<Frame, LinkError> {
        let rx = self
            .rx
            .get(src)
            .and_then(Option::as_ref)
            .ok_or_else(|| self.peer_error(src))?;
        rx.recv_deadline(deadline).map_err(|e| match e {
            RecvTimeoutError::Timeout => LinkError::Timeout,
            RecvTimeoutError::Disconnected => LinkError::Gone,
        })
    }

    fn notify(&mut self, dst: usize, frame: Frame) {
        if let Some(tx) = self.tx.get(dst).and_then(Option::as_ref) {
            // Best effort: if the channel is full the peer is not reading and will time out.
            if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = tx.try_send(frame) {
                // Nothing more to do: the peer is not reading (it will time out) or is gone.
            }
        }
    }

    fn split(&mut self, timeout: Duration) -> Result<Box<dyn Collective>> {
        let key = self.splits;
        self.splits += 1;
        // A poisoned lock only means another member panicked while holding it; the map is
        // still consistent (every operation on it is a single insert/take/remove).
        let mut pending = self
            .registry
            .pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let members = pending.entry(key).or_insert_with(|| {
            ThreadGroup::new(self.size, timeout)
                .into_iter()
                .map(Some)
                .collect()
        });
        let mine = members.get_mut(self.rank).and_then(Option::take);
        if members.iter().all(Option::is_none) {
            pending.remove(&key);
        }
        match mine {
            Some(mut member) => {
                member.engine.set_timeout(timeout);
                Ok(Box::new(member))
            }
            None => Err(CollectiveError::Mismatch {
                op: "split",
                rank: self.rank,
                detail: format!("split #{key} was already taken by this rank"),
            }),
        }
    }
}
