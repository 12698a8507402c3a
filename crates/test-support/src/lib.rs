//! Test fixtures shared by the burn-ckpt crates' integration tests (a dev-dependency only).
//!
//! - [`alloc`]: [`alloc::Watchful`], a global allocator that records the largest allocation
//!   and refuses absurd ones (hostile-input tests).
//! - [`fs`]: small filesystem helpers: checkpoint directories, leftover temporary entries,
//!   flipping a byte of a file.
//! - [`simdisk`]: [`simdisk::SimDisk`], an in-memory [`ckpt_core::Storage`] whose page cache a
//!   simulated power cut empties, for the power-loss test.
//! - `tiny` (feature `tiny`): the `Tiny` MLP learner fixture for Burn's `SupervisedTraining`.

pub mod alloc;
pub mod fs;
pub mod simdisk;
#[cfg(feature = "tiny")]
pub mod tiny;
