//! The node-local memory tier: every rank keeps its part of its newest checkpoints in a
//! directory on the node's memory (tmpfs, for example `/dev/shm`), sends a replica of each to
//! peer ranks on other nodes, and at a restart the ranks recover from the newest step that is
//! whole across the tiers.
//!
//! Layout, under the node-local directory ([`MemoryTier::node_dir`]) of each rank:
//!
//! ```text
//! <node dir>/run-<run id>/rank-<r>-of-<n>/step-<step>/      rank r's own part
//! <node dir>/run-<run id>/replica-<q>-of-<n>/step-<step>/   the replica of rank q's part
//! ```
//!
//! Each `step-*` directory is an ordinary checkpoint directory (manifest, checksums,
//! `latest`, retention; `ckpt ls` and `ckpt verify` read it) whose layout is
//! [`PART_LAYOUT`]: rank r's part holds its optimizer shard (`optim.rank-<r>-of-<n>.bpk`), the
//! scheduler and trainer state, and on rank 0 the model (`model.bpk`). The manifest names the
//! run ([`RUN_KEY`]) and the rank whose part it is ([`RANK_KEY`]); a part of another run is
//! never read, and neither is a directory of another run id.
//!
//! **Durability here means "in the node's memory"**: the tier is published with the same
//! protocol as the disk tier through [`ckpt_core::Storage`] (files written and fsynced, the
//! manifest last, an atomic rename), and on tmpfs fsync returns at once, so a part survives the
//! crash of its process but not the loss of its node. Its replicas on other nodes cover that.
//!
//! A memory save comes at most every [`MemoryTier::every`] steps, independent of the disk
//! saves, on a thread of its own with a collective group of its own; when any rank's previous
//! memory save is still running, every rank skips this one (counted in the report), so the
//! tier never makes training wait, and a save is skipped too when it would take the tier's
//! measured cost over its overhead budget ([`MemoryTier::budget`], 5 % by default). A save publishes the rank's own part, sends it to its peers
//! ([`crate::collective::Collective::send_recv`]), publishes the replicas it receives, and the
//! ranks agree on the outcome. Recovery ([`crate::RankManager::resume_from`]) picks the newest
//! step that every rank can restore, never one older than the disk tier's newest.

mod recover;
mod saver;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

#[cfg(feature = "remote")]
pub(crate) use recover::ObjectStore;
pub(crate) use recover::recover;
pub(crate) use saver::{TierSaver, remove_rank_dirs};

/// The placeholder in [`MemoryTier::new`]'s directory replaced by the rank's node index (to
/// simulate several nodes on one machine; on real nodes the same path names each node's own
/// memory).
pub const NODE_PLACEHOLDER: &str = "{node}";
/// The manifest layout of a memory-tier part.
pub const PART_LAYOUT: &str = "memory-part";
/// The manifest entry naming the run a part belongs to.
pub const RUN_KEY: &str = "run_id";
/// The manifest entry naming the rank whose part a checkpoint directory holds.
pub const RANK_KEY: &str = "part_of_rank";

/// Failpoint (feature `failpoints`, action `return`): every memory save is waited for before
/// the step returns, so a test knows what the tier holds when it kills the run; `return(S)`
/// also aborts the process once the save of step `S` is done, on the training thread, before
/// the next step can start (a kill at a known point, free of timing).
#[cfg(feature = "failpoints")]
pub const FP_MEMORY_TIER_WAIT: &str = "memory_tier_wait";
/// Failpoint (feature `failpoints`, action `sleep(MS)`): each memory save's submit on the
/// training thread takes that much longer, a cost the overhead budget must see.
#[cfg(feature = "failpoints")]
pub const FP_MEMORY_TIER_SUBMIT: &str = "memory_tier_submit";
/// Failpoint (feature `failpoints`, action `return(R@S)`): rank `R`'s tier thread dies (a
/// panic) in the memory save of step `S`, after publishing its own part, before the exchange.
#[cfg(feature = "failpoints")]
pub const FP_MEMORY_TIER_DIE: &str = "memory_tier_die";
/// Failpoint (feature `failpoints`, action `return(R@S)`): rank `R`'s own part of the memory
/// save of step `S` fails to publish, as a full tmpfs would make it.
#[cfg(feature = "failpoints")]
pub const FP_MEMORY_TIER_PART: &str = "memory_tier_part";
/// Failpoint (feature `failpoints`, action `return(R@S)`): rank `R`'s tier thread panics while
/// writing its own part of the memory save of step `S` (a bug in capture or encoding).
#[cfg(feature = "failpoints")]
pub const FP_MEMORY_TIER_PANIC: &str = "memory_tier_panic";

/// Settings of the node-local memory tier (see the module docs); the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryTier {
    dir: PathBuf,
    every: u64,
    budget: Option<f64>,
    replicas: usize,
    ranks_per_node: usize,
    keep: usize,
}

impl MemoryTier {
    /// A tier in the node-local directory `dir` (on tmpfs, for example
    /// `/dev/shm/my-run`; [`NODE_PLACEHOLDER`] in it is replaced by the node index), saving
    /// at most every `every` steps. Defaults: a budget of [`Self::DEFAULT_BUDGET`] of the
    /// training time, 1 replica, 1 rank per node, the newest 2 steps kept.
    pub fn new(dir: impl Into<PathBuf>, every: u64) -> Self {
        Self {
            dir: dir.into(),
            every,
            budget: Some(Self::DEFAULT_BUDGET),
            replicas: 1,
            ranks_per_node: 1,
            keep: 2,
        }
    }

    /// The default overhead budget: memory saves may cost training at most 5 % of its time.
    pub const DEFAULT_BUDGET: f64 = 0.05;

    /// The most the tier's saves may cost training, as a fraction of the training time
    /// (default [`Self::DEFAULT_BUDGET`]). What each save costs is measured on every rank as
    /// the disk tier's overhead budget measures it (the submit's stall plus the excess over
    /// the baseline step time of the steps while the save runs and one after); a save that
    /// is due is taken only when rank 0's account stays within the budget (every rank follows
    /// it, as disk saves follow rank 0's decision), and after at
    /// least one clean step, so the baseline stays measured. The first one waits for the
    /// warm-up's slow steps to settle (5 steps at least).
    pub fn budget(mut self, fraction: f64) -> Self {
        self.budget = Some(fraction);
        self
    }

    /// No budget: a save every [`Self::every`] steps whenever the previous one is done,
    /// whatever it costs (what the tests that kill a run at a known step use).
    pub fn no_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// The overhead budget, if any.
    pub fn overhead_budget(&self) -> Option<f64> {
        self.budget
    }

    /// How many peers on other nodes keep a replica of each rank's part (default 1; 0 keeps
    /// parts on their own node only).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Ranks per node: ranks `k * n .. (k + 1) * n` share node `k` (default 1).
    pub fn ranks_per_node(mut self, n: usize) -> Self {
        self.ranks_per_node = n;
        self
    }

    /// How many of the newest steps each rank keeps (its own part and each replica; default 2).
    pub fn keep_last(mut self, n: usize) -> Self {
        self.keep = n;
        self
    }

    /// Steps between two memory saves.
    pub fn every(&self) -> u64 {
        self.every
    }

    /// Replicas of each part.
    pub fn replica_count(&self) -> usize {
        self.replicas
    }

    /// Steps kept per part.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Checks the settings for a run of `world` ranks: an error says what to change.
    pub fn validate(&self, world: usize) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("memory tier: {m}")));
        if self.every == 0 {
            return bad("the interval must be at least 1 step".into());
        }
        if self.keep == 0 {
            return bad("it must keep at least 1 step".into());
        }
        if let Some(b) = self.budget
            && !(b > 0.0 && b <= 1.0)
        {
            return bad(format!(
                "the overhead budget must be a fraction in (0, 1], not {b} (or no budget)"
            ));
        }
        if self.ranks_per_node == 0 || !world.is_multiple_of(self.ranks_per_node) {
            return bad(format!(
                "{world} ranks do not split into nodes of {} ranks",
                self.ranks_per_node
            ));
        }
        let nodes = world / self.ranks_per_node;
        if self.replicas >= nodes.max(1) && self.replicas > 0 {
            return bad(format!(
                "{} replica(s) need {} nodes besides each rank's own, but {world} ranks at {} \
                 per node are {nodes} node(s) (give the ranks per node, or fewer replicas)",
                self.replicas, self.replicas, self.ranks_per_node
            ));
        }
        Ok(())
    }

    /// The node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node.max(1)
    }

    /// The node-local directory of `rank` ([`NODE_PLACEHOLDER`] replaced by its node).
    pub fn node_dir(&self, rank: usize) -> PathBuf {
        let s = self.dir.to_string_lossy();
        if s.contains(NODE_PLACEHOLDER) {
            PathBuf::from(s.replace(NODE_PLACEHOLDER, &self.node_of(rank).to_string()))
        } else {
            self.dir.clone()
        }
    }

    /// `rank`'s directory of run `run`.
    pub(crate) fn run_dir(&self, rank: usize, run: &str) -> PathBuf {
        self.node_dir(rank).join(format!("run-{run}"))
    }

    /// Where `rank` keeps its own part.
    pub(crate) fn own_root(&self, rank: usize, world: usize, run: &str) -> PathBuf {
        self.run_dir(rank, run)
            .join(format!("rank-{rank}-of-{world}"))
    }

    /// Where `holder` keeps its replica of rank `of`'s part.
    pub(crate) fn replica_root(
        &self,
        holder: usize,
        of: usize,
        world: usize,
        run: &str,
    ) -> PathBuf {
        self.run_dir(holder, run)
            .join(format!("replica-{of}-of-{world}"))
    }

    /// The rank that keeps replica `k` (1-based) of `rank`'s part: the same place on the
    /// `k`-th next node.
    pub(crate) fn peer(&self, rank: usize, k: usize, world: usize) -> usize {
        (rank + k * self.ranks_per_node) % world
    }

    /// The rank whose replica `k` `rank` keeps.
    pub(crate) fn source(&self, rank: usize, k: usize, world: usize) -> usize {
        (rank + world - (k * self.ranks_per_node) % world) % world
    }

    /// Whether `step` gets a memory save.
    pub(crate) fn due(&self, step: u64) -> bool {
        self.every > 0 && step.is_multiple_of(self.every)
    }
}

/// What the memory tier did on one rank, in [`crate::RankReport::memory`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryTierReport {
    /// The steps of the memory saves published whole on every rank (every part and
    /// replica), in order.
    pub saved: Vec<u64>,
    /// Memory saves every rank skipped because some rank's previous one was still running.
    pub skipped: usize,
    /// Memory saves every rank skipped to keep rank 0's account within the overhead budget,
    /// or for a clean step that measures the baseline step time.
    pub throttled: usize,
    /// What the tier's saves cost this rank's training, measured (s): each submit's stall
    /// plus the excess over the baseline step time of the steps while a save ran and one
    /// after. `None` when fewer than 5 steps ran without a save to measure the baseline
    /// (saves back to back without a budget).
    pub lost_s: Option<f64>,
    /// Training time of this rank in the same account (s), the steps and the stalls.
    pub training_s: f64,
    /// Memory saves that were not whole on every rank (each was a warning).
    pub failed: usize,
    /// Each whole save's time on this rank's tier thread, from the part's capture to the
    /// ranks' agreement (ms).
    pub save_ms: Vec<f64>,
    /// Where each whole save's time went, in the order of [`Self::save_ms`].
    pub phases: Vec<SavePhases>,
    /// Each submitted save's stall: the time the training thread spent on it at its step
    /// (the ranks' agreement to save, the part's capture, the hand-off to the tier's thread)
    /// plus the optimizer updates' waits for it where it was the newest save (newer than the
    /// newest disk save; see `RankManager::before_update`), in ms, in the order submitted (a
    /// save that was not whole in the end included).
    pub stall_ms: Vec<f64>,
    /// The most bytes this rank's tier held after a save (its own parts and its replicas).
    pub peak_bytes: u64,
    /// The tier went off during the run (its group failed; an error said so).
    pub off: bool,
}

/// Where one memory save's time went on a rank's tier thread (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SavePhases {
    /// Capturing the part and publishing it in the rank's own tier (written, checksummed).
    pub own_ms: f64,
    /// Reading the published part back, checked against its manifest, to send it.
    pub read_ms: f64,
    /// Sending the part to the peers and receiving their parts (the collective).
    pub exchange_ms: f64,
    /// Publishing the received replicas in this rank's tier.
    pub replica_ms: f64,
    /// The ranks' agreement on the outcome (waiting for the slowest rank).
    pub agree_ms: f64,
}

/// The header of a [`part frame`](read_frame): what follows it.
#[derive(Serialize, Deserialize)]
enum FrameHeader {
    /// The part's files, their bytes back to back after the header in this order.
    Part {
        /// Step.
        step: u64,
        /// Epoch.
        epoch: u64,
        /// File names and sizes, as the part's manifest lists them.
        files: Vec<(String, u64)>,
    },
    /// The sender has no part to send (its own save failed, or its copy is unreadable).
    Missing(String),
}

/// Bytes before the header: its length, u64 little-endian.
const FRAME_PREFIX: usize = 8;

fn frame_with(header: &FrameHeader, body: usize) -> Result<(Vec<u8>, usize)> {
    let head = bincode::serde::encode_to_vec(header, bincode::config::standard())
        .map_err(|e| Error::Config(format!("cannot encode a memory-tier frame header: {e}")))?;
    let at = FRAME_PREFIX + head.len();
    // Zeroed pages are mapped lazily: the body costs memory only as it is read into.
    let mut frame = vec![0u8; at + body];
    frame[..FRAME_PREFIX].copy_from_slice(&(head.len() as u64).to_le_bytes());
    frame[FRAME_PREFIX..at].copy_from_slice(&head);
    Ok((frame, at))
}

/// One rank's part of a step as it travels between ranks (a replica, or a part sent back at
/// recovery): a small header (step, epoch, the files' names and sizes, or why the part is
/// missing), then the files' bytes back to back. The files are read from the tier straight
/// into the frame, each checked against the manifest while it is read, and the receiver
/// writes them from the frame: the bytes are never encoded or copied in between.
pub(crate) fn read_frame(dir: &Path) -> Result<Vec<u8>> {
    let manifest = ckpt_core::read_manifest(dir)?;
    let header = FrameHeader::Part {
        step: manifest.step,
        epoch: manifest.epoch,
        files: manifest
            .files
            .iter()
            .map(|f| (f.name.clone(), f.size))
            .collect(),
    };
    let body = manifest.files.iter().map(|f| f.size).sum::<u64>();
    let body = usize::try_from(body).map_err(|_| Error::Tier {
        path: dir.to_path_buf(),
        reason: format!("a part of {body} bytes does not fit in memory here"),
    })?;
    let (mut frame, mut at) = frame_with(&header, body)?;
    for f in &manifest.files {
        let end = at + f.size as usize;
        manifest.read_part_into(dir, &f.name, |_| &mut frame[at..end])?;
        at = end;
    }
    Ok(frame)
}

/// [`read_frame`], or a frame saying why the part is missing.
pub(crate) fn read_frame_or_missing(dir: &Path) -> Result<Vec<u8>> {
    read_frame(dir).or_else(|e| missing_frame(&e.to_string()))
}

/// A frame saying the sender has no part, and why.
pub(crate) fn missing_frame(why: &str) -> Result<Vec<u8>> {
    Ok(frame_with(&FrameHeader::Missing(why.into()), 0)?.0)
}

/// Publishes the part in `frame` (received from rank `from`) in `engine`'s root as rank
/// `of`'s part of run `run` (`world` ranks); returns the bytes published. A frame that does
/// not parse, whose sizes do not add up, or that says the part is missing is an error naming
/// the sender; a flipped byte in a file is caught when the tier is next verified (its
/// checksum is computed as it is written here, and the sender checked it as it read it).
pub(crate) fn publish_frame(
    frame: Vec<u8>,
    from: usize,
    engine: &mut ckpt_core::Engine,
    of: usize,
    world: usize,
    run: &str,
) -> Result<u64> {
    let bad = |reason: String| Error::Tier {
        path: PathBuf::from(format!("rank {from}")),
        reason,
    };
    let head_len = frame
        .get(..FRAME_PREFIX)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= frame.len() - FRAME_PREFIX)
        .ok_or_else(|| {
            bad(format!(
                "a part frame of {} bytes has no header",
                frame.len()
            ))
        })?;
    let body_at = FRAME_PREFIX + head_len;
    let header: FrameHeader = bincode::serde::decode_from_slice(
        &frame[FRAME_PREFIX..body_at],
        bincode::config::standard(),
    )
    .map(|(h, _)| h)
    .map_err(|e| bad(format!("undecodable part header: {e}")))?;
    let (step, epoch, files) = match header {
        FrameHeader::Part { step, epoch, files } => (step, epoch, files),
        FrameHeader::Missing(why) => return Err(bad(format!("sent no part of rank {of}: {why}"))),
    };
    let body = files
        .iter()
        .try_fold(0u64, |sum, (_, n)| sum.checked_add(*n))
        .filter(|&b| b == (frame.len() - body_at) as u64)
        .ok_or_else(|| {
            bad(format!(
                "a part frame's file sizes do not add up to the {} bytes that came",
                frame.len() - body_at
            ))
        })?;
    debug_assert_eq!(body as usize, frame.len() - body_at);
    let frame = std::sync::Arc::new(frame);
    let mut snap = part_snapshot(step, epoch, of, world, run);
    let mut at = body_at;
    for (name, size) in files {
        let (range, frame) = (at..at + size as usize, frame.clone());
        at = range.end;
        snap = snap.with_producer(name, move |sink: &mut dyn std::io::Write| {
            sink.write_all(&frame[range])?;
            Ok(())
        });
    }
    drop(frame);
    engine.submit(snap)?;
    Ok(engine.wait_idle()?.iter().map(|e| e.bytes).sum())
}

/// An empty memory-tier part of rank `of` at `step` (manifest entries set).
pub(crate) fn part_snapshot(
    step: u64,
    epoch: u64,
    of: usize,
    world: usize,
    run: &str,
) -> ckpt_core::Snapshot {
    ckpt_core::Snapshot::new(step)
        .with_epoch(epoch)
        .with_layout(world as u32, PART_LAYOUT)
        .with_meta(RUN_KEY, run)
        .with_meta(RANK_KEY, of as u64)
}

/// Opens a tier root (created if missing) keeping the newest `keep` steps.
pub(crate) fn open_root(root: &Path, keep: usize) -> Result<ckpt_core::Engine> {
    std::fs::create_dir_all(root).map_err(|e| Error::Tier {
        path: root.to_path_buf(),
        reason: format!("cannot create the directory: {e}"),
    })?;
    let config =
        ckpt_core::EngineConfig::new(root).retention(ckpt_core::Retention::keep_last(keep));
    Ok(ckpt_core::Engine::open(config)?.0)
}

/// The steps of rank `of`'s part in `root` that verify (every checksum) and belong to run
/// `run`; each one that does not is a warning naming it.
pub(crate) fn valid_steps(root: &Path, of: usize, run: &str) -> Vec<u64> {
    let list = match ckpt_core::list_checkpoints(root, true) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(tier = %root.display(), error = %e, "memory tier unreadable; not used");
            return Vec::new();
        }
    };
    let mut steps = Vec::new();
    for c in list {
        let Some(m) = c.manifest else {
            let reason = match c.status {
                ckpt_core::CheckpointStatus::Invalid(r) => r,
                _ => "no manifest".into(),
            };
            tracing::warn!(part = %c.path.display(), %reason,
                "memory-tier part of rank {of} is invalid; not used");
            continue;
        };
        let run_ok = m.meta.get(RUN_KEY).and_then(|v| v.as_str()) == Some(run);
        let rank_ok = m.meta.get(RANK_KEY).and_then(|v| v.as_u64()) == Some(of as u64);
        if m.layout != PART_LAYOUT || !run_ok || !rank_ok {
            tracing::warn!(part = %c.path.display(), run = ?m.meta.get(RUN_KEY),
                "memory-tier directory holds a part of another run or rank; ignored");
            continue;
        }
        steps.push(c.step);
    }
    steps
}

/// Total bytes of the checkpoints in `root` (from their manifests).
pub(crate) fn root_bytes(root: &Path) -> u64 {
    ckpt_core::list_checkpoints(root, false)
        .map(|l| l.iter().map(|c| c.bytes).sum())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part of rank 1 (2 files) published in `root`; its directory.
    fn published_part(root: &Path) -> PathBuf {
        let mut e = open_root(root, 2).unwrap();
        let snap = part_snapshot(7, 1, 1, 2, "run-a")
            .with_bytes("a.bin", vec![1u8; 1000])
            .with_bytes("b.bin", (0..=255u8).collect());
        e.submit(snap).unwrap();
        e.wait_idle().unwrap();
        e.finish().unwrap();
        root.join(ckpt_core::layout::checkpoint_dir_name(7))
    }

    #[test]
    fn a_frame_carries_a_part_to_a_peer_byte_for_byte() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = published_part(&tmp.path().join("own"));
        let frame = read_frame(&dir).unwrap();
        let mut peer = open_root(&tmp.path().join("replica"), 2).unwrap();
        publish_frame(frame, 1, &mut peer, 1, 2, "run-a").unwrap();
        peer.finish().unwrap();
        let got = tmp.path().join("replica").join(dir.file_name().unwrap());
        for f in ["a.bin", "b.bin"] {
            assert_eq!(
                std::fs::read(dir.join(f)).unwrap(),
                std::fs::read(got.join(f)).unwrap()
            );
        }
        assert_eq!(
            valid_steps(&tmp.path().join("replica"), 1, "run-a"),
            vec![7]
        );
    }

    #[test]
    fn a_bad_frame_is_an_error_naming_its_sender() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = published_part(&tmp.path().join("own"));
        let frame = read_frame(&dir).unwrap();
        let mut peer = open_root(&tmp.path().join("replica"), 2).unwrap();
        let err = |f: Vec<u8>, peer: &mut ckpt_core::Engine| {
            publish_frame(f, 3, peer, 1, 2, "run-a")
                .unwrap_err()
                .to_string()
        };
        let short = frame[..frame.len() - 1].to_vec();
        assert!(err(short, &mut peer).contains("rank 3"));
        assert!(err(vec![1, 2, 3], &mut peer).contains("no header"));
        let mut garbled = frame.clone();
        garbled[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(garbled, &mut peer).contains("no header"));
        let missing = missing_frame("its tmpfs is full").unwrap();
        assert!(err(missing, &mut peer).contains("its tmpfs is full"));
        // A file changed on the sender's tier is caught as it is read.
        let mut bytes = std::fs::read(dir.join("a.bin")).unwrap();
        bytes[10] ^= 1;
        std::fs::write(dir.join("a.bin"), bytes).unwrap();
        assert!(read_frame(&dir).is_err());
        peer.finish().unwrap();
        assert!(valid_steps(&tmp.path().join("replica"), 1, "run-a").is_empty());
    }

    #[test]
    fn peers_sit_on_other_nodes_and_sources_invert_them() {
        let t = MemoryTier::new("/dev/shm/x/node-{node}", 1).ranks_per_node(2);
        t.validate(4).unwrap();
        assert_eq!(t.node_dir(3), PathBuf::from("/dev/shm/x/node-1"));
        assert_eq!(t.node_dir(1), PathBuf::from("/dev/shm/x/node-0"));
        for r in 0..4 {
            let p = t.peer(r, 1, 4);
            assert_ne!(t.node_of(p), t.node_of(r));
            assert_eq!(t.source(p, 1, 4), r);
        }
        let three = MemoryTier::new("/m", 1).replicas(2);
        three.validate(3).unwrap();
        for r in 0..3 {
            for k in 1..=2 {
                assert_eq!(three.source(three.peer(r, k, 3), k, 3), r);
            }
        }
    }

    #[test]
    fn bad_settings_say_what_to_change() {
        let e = |t: MemoryTier, w| t.validate(w).unwrap_err().to_string();
        assert!(e(MemoryTier::new("/m", 0), 2).contains("at least 1 step"));
        assert!(e(MemoryTier::new("/m", 1).budget(0.0), 1).contains("budget"));
        assert!(e(MemoryTier::new("/m", 1).budget(f64::NAN), 1).contains("budget"));
        assert!(e(MemoryTier::new("/m", 1).ranks_per_node(3), 4).contains("nodes of 3"));
        assert!(e(MemoryTier::new("/m", 1).ranks_per_node(4), 4).contains("1 node"));
        MemoryTier::new("/m", 1)
            .replicas(0)
            .ranks_per_node(4)
            .validate(4)
            .unwrap();
    }
}
