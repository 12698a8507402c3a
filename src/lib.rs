//! `burn-ckpt`: non-stalling, crash-safe checkpointing for Burn training runs (facade).
//!
//! - [`ckpt_core`]: the framework-agnostic engine (snapshot, background persist, atomic
//!   publication, recovery, retention, frequency policies).
//! - [`ckpt_burn`]: the Burn 0.22.1 integration (capture at a step boundary, resumable data
//!   loader, restore, the example trainer).
//! - [`ckpt_zero`]: ZeRO-1 data-parallel training with sharded checkpoints over thread or MPI
//!   collectives.
//! - [`ckpt_alloc`]: an opt-in global allocator that backs large blocks with transparent huge
//!   pages (a training program's choice, not the library's: `#[global_allocator]`).

pub use ckpt_alloc;
pub use ckpt_burn;
pub use ckpt_core;
pub use ckpt_zero;
