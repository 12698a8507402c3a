//! Test fixtures shared by the burn-ckpt crates' integration tests (a dev-dependency only).
//!
//! - [`alloc`]: [`alloc::Watchful`], a global allocator that records the largest allocation
//!   and refuses absurd ones (hostile-input tests); [`alloc::Counting`], one that counts the
//!   bytes live at once (memory-peak tests).
//! - [`fs`]: small filesystem helpers: checkpoint directories, leftover temporary entries,
//!   flipping a byte of a file.
//! - [`s3`]: a real S3-compatible server (`moto_server`) started by the tests, and a proxy
//!   that injects 503s, slowness and outages in front of it.
//! - [`simdisk`]: [`simdisk::SimDisk`], an in-memory [`ckpt_core::Storage`] whose page cache a
//!   simulated power cut empties, for the power-loss test.
//! - `tiny` (feature `tiny`): the `Tiny` MLP learner fixture for Burn's `SupervisedTraining`.

pub mod alloc;
pub mod fs;
pub mod s3;
pub mod simdisk;
#[cfg(feature = "tiny")]
pub mod tiny;
