//! Collective communication for ZeRO training and checkpoint traffic.
//!
//! A [`Collective`] is one member (one rank) of a group of ranks that moves bytes (and sums
//! `f32` gradients deterministically). Groups are plain values: there is no process-global group
//! state, so a training group and a dedicated checkpoint group (made with [`Collective::split`])
//! can be used concurrently from different threads without their traffic ever mixing.
//!
//! Backends:
//! * [`ThreadGroup`]: ranks are threads of one process (Burn's DDP model), built on bounded
//!   crossbeam channels. Always available.
//! * `mpi::MpiGroup` (cargo feature `mpi`): ranks are MPI processes launched by `mpirun`/`srun`.
//!
//! Both backends share one wire protocol and one set of algorithms (a star around a root rank):
//! every transfer is split into frames of at most [`CHUNK_SIZE`] bytes (no C-`int` count
//! overflow, bounded memory per in-flight frame), every frame carries the call's sequence number
//! and operation so ranks that call different operations (or different sizes) get
//! [`CollectiveError::Mismatch`] instead of garbage, and every wait for a peer is bounded by the
//! group's [`Collective::timeout`].
//!
//! After any error the group should be treated as broken: ranks may disagree about which calls
//! completed. Drop it (and usually abort the run or the checkpoint).

mod engine;
mod thread;

/// Conformance checks for [`Collective`] implementations (feature `testing`).
#[cfg(feature = "testing")]
pub mod conformance;
/// Building `mpirun` commands for tests (feature `testing`).
#[cfg(feature = "testing")]
pub mod mpi_launch;

#[cfg(feature = "mpi")]
pub mod mpi;

use std::time::Duration;

pub use thread::ThreadGroup;

/// Largest payload of one frame on the wire (4 MiB). Transfers larger than this are chunked.
pub const CHUNK_SIZE: usize = 4 << 20;

/// Result type of every collective call.
pub type Result<T> = std::result::Result<T, CollectiveError>;

/// Why a collective call failed.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// Waiting for a peer took longer than the group's timeout. `peer` is the rank that was
    /// waited for, when known (it may have been observed by the root and relayed to this rank).
    #[error("{op}: rank {rank} waited longer than {after:?} for {}", peer_name(.peer))]
    Timeout {
        /// The collective operation that failed.
        op: &'static str,
        /// The rank reporting the error.
        rank: usize,
        /// The rank that did not respond in time, when known.
        peer: Option<usize>,
        /// The timeout that was exceeded.
        after: Duration,
    },
    /// A peer left the group (its thread died or dropped its member).
    #[error("{op}: rank {rank}: peer rank {peer} is gone")]
    PeerGone {
        /// The collective operation that failed.
        op: &'static str,
        /// The rank reporting the error.
        rank: usize,
        /// The rank that is gone.
        peer: usize,
    },
    /// Ranks disagree about the call: different operations, roots or sizes, or calls out of
    /// order.
    #[error("{op}: rank {rank}: ranks disagree: {detail}")]
    Mismatch {
        /// The collective operation that failed.
        op: &'static str,
        /// The rank reporting the error.
        rank: usize,
        /// What was expected and what arrived.
        detail: String,
    },
    /// The MPI library reported an error (or could not be set up as required).
    #[error("MPI: {0}")]
    Mpi(String),
    /// The call's arguments are invalid (for example a root outside the group).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

fn peer_name(peer: &Option<usize>) -> String {
    match peer {
        Some(p) => format!("rank {p}"),
        None => "a peer".to_string(),
    }
}

/// A group of ranks that moves bytes; this value is the calling rank's member of the group.
///
/// Object safe, and `Send` so a checkpoint group can live on a background persist thread. All
/// methods are collective: every rank of the group must make the same calls in the same order
/// (same operation, same root, same `f32` length for [`Collective::all_reduce_sum_f32`]).
pub trait Collective: Send {
    /// This member's rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the group.
    fn size(&self) -> usize;

    /// Deadline applied to every call: waiting for a peer (one frame sent or received) longer
    /// than this is a [`CollectiveError::Timeout`].
    fn timeout(&self) -> Duration;

    /// Sets the deadline used by later calls on this member.
    fn set_timeout(&mut self, t: Duration);

    /// Element-wise sum over ranks, result on every rank, in place.
    ///
    /// Deterministic and bitwise identical on every rank: the sum is computed as a fixed
    /// pairwise tree over ranks in rank order, independent of timing. The rank range `[lo, hi)`
    /// is split at `lo + next_power_of_two(hi - lo) / 2`, so 2 ranks give `r0 + r1`, 3 give
    /// `(r0 + r1) + r2` and 4 give `(r0 + r1) + (r2 + r3)`. With identical inputs `g` on 2 or 4
    /// ranks the result is exactly `2g` / `4g`, so dividing by the rank count gives back `g`
    /// bit for bit. Every rank must pass the same length.
    fn all_reduce_sum_f32(&mut self, data: &mut [f32]) -> Result<()>;

    /// Root's `data` is sent to all ranks; on the other ranks `data` is replaced by it (any
    /// prior length). On error a non-root's `data` is left unchanged.
    fn broadcast(&mut self, root: usize, data: &mut Vec<u8>) -> Result<()>;

    /// Variable-length buffers to `root`: `Some(buffers in rank order)` at root, `None`
    /// elsewhere. The root receives chunk by chunk, round-robin over the ranks.
    fn gather(&mut self, root: usize, data: &[u8]) -> Result<Option<Vec<Vec<u8>>>>;

    /// Every rank gets every rank's buffer (any lengths), in rank order.
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<()>;

    /// True on every rank iff every rank passed true (used to agree that a checkpoint commit
    /// succeeded).
    fn all_agree(&mut self, ok: bool) -> Result<bool>;

    /// Point-to-point transfers as one collective call: every rank calls it; this rank sends
    /// `data` to rank `to` and gets the buffer rank `from` sent it (`None` on either side: no
    /// transfer that way). The ranks' `to` and `from` must match (rank a sends to b exactly
    /// when b receives from a); a rank waiting for a buffer that never comes times out. Used to
    /// replicate a rank's part of a checkpoint to a peer and to send it back at recovery.
    fn send_recv(
        &mut self,
        to: Option<usize>,
        data: &[u8],
        from: Option<usize>,
    ) -> Result<Option<Vec<u8>>>;

    /// Collective: every rank calls it, in the same order relative to the group's other calls.
    /// Returns an independent group with the same ranks (same rank numbers) and the same timeout,
    /// whose traffic never mixes with this one's (for checkpoint traffic). The new group may be
    /// moved to another thread and used concurrently with this one.
    fn split(&mut self) -> Result<Box<dyn Collective>>;
}
