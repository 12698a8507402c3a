//! `burn-ckpt`: non-stalling, crash-safe checkpointing for Burn 0.22.1 training runs. This crate
//! is the one dependency to add; features `wgpu`, `cuda`, `mpi` and `remote` switch on the
//! backends, MPI ranks and the object-store tier.
//!
//! A save takes a consistent snapshot of the training state at a step boundary (handle clones:
//! microseconds on the training thread), then stages, encodes and writes it in the background
//! and publishes it atomically (`ROOT/step-<step:08>/` with a manifest, `ROOT/latest`). It holds
//! the model, the optimizer, the LR scheduler, the data-loader position and the RNG seeds, so a
//! crashed run resumes exactly.
//!
//! # Through Burn's learner
//!
//! ```no_run
//! # use burn::train::{Learner, LearnerModel, SupervisedTraining, TrainLoader, ValidLoader};
//! # use burn::tensor::Device;
//! # fn demo<M: LearnerModel>(train: TrainLoader<M>, valid: ValidLoader<M>, device: Device,
//! #     learner: Learner<M>) -> Result<(), burn_ckpt::ckpt_burn::Error> {
//! use burn_ckpt::{CkptCheckpointers, CkptTrainingStrategy, EngineConfig, FrequencyPolicy, Retention};
//!
//! let ckpt = CkptCheckpointers::open(EngineConfig::new("runs/x/ckpt").retention(Retention::keep_last(3)))?;
//! let result = SupervisedTraining::new("runs/x", train, valid)
//!     .with_training_strategy(
//!         CkptTrainingStrategy::new(device, &ckpt, FrequencyPolicy::EverySteps(100))
//!             .resume_latest()
//!             .into_training_strategy())
//!     .launch(learner);
//! ckpt.finish()?;
//! # Ok(()) }
//! ```
//!
//! # From a loop of your own
//!
//! ```no_run
//! # use burn::optim::ModuleOptimizer;
//! # use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
//! # fn demo<M: burn::module::Module + 'static>(mut model: M, mut optim: ModuleOptimizer,
//! #     mut sched: ModuleLrScheduler, steps: u64) -> Result<(), burn_ckpt::ckpt_burn::Error> {
//! use burn_ckpt::{CheckpointManager, DataCursor, ManagerConfig};
//!
//! let mut ckpt = CheckpointManager::open(ManagerConfig::new("runs/x").every_steps(100).end_step(steps))?;
//! let start = ckpt.resume(&mut model, &mut optim, &mut sched)?.map_or(0, |t| t.step);
//! for step in start + 1..=steps {
//!     // forward, backward, optimizer step
//!     if ckpt.step(step, &model, &optim, &sched, DataCursor::default())? { break; }
//! }
//! ckpt.finish()?;
//! # Ok(()) }
//! ```
//!
//! Everything else has a default (the newest 3 checkpoints kept, one save persisting at a time,
//! [`SaveTuning`]'s `auto` settings); [`ManagerConfig`] lists the rest: a stop flag with a
//! grace period, the error policy, the object-store tier (feature `remote`).
//!
//! # Preemption
//!
//! [`StopOnSignal`] turns the first SIGTERM or SIGINT into a stop at the next step boundary
//! with a final checkpoint: [`StopOnSignal::install`] for Burn's learner (its interrupter),
//! [`StopOnSignal::install_flag`] for [`ManagerConfig::stop_on`].
//!
//! # The guide
//!
//! The repository's `README.md` is the front page and `docs/` the guide: the learner route,
//! custom loops, exact resume and its limits, ZeRO-1 and MPI, the object-store tier,
//! preemption and batch systems, the `ckpt` command, every option with its default,
//! performance, reliability and the design.
//!
//! # The crates behind it
//!
//! - [`ckpt_core`]: the framework-agnostic engine (snapshot, background persist, atomic
//!   publication, recovery, retention, frequency policies, the per-step session).
//! - [`ckpt_burn`]: the Burn integration (capture at a step boundary, the learner strategy and
//!   checkpointers, [`CheckpointManager`], the resumable data loader, restore).
//! - [`ckpt_zero`]: ZeRO-1 data-parallel training with sharded checkpoints over thread or MPI
//!   collectives.
//! - `ckpt_remote` (feature `remote`): the object-store tier (S3-compatible storage).
//! - [`ckpt_alloc`]: an opt-in global allocator that backs large blocks with transparent huge
//!   pages (a training program's choice, not the library's: `#[global_allocator]`).

pub use ckpt_alloc;
pub use ckpt_burn;
pub use ckpt_core;
#[cfg(feature = "remote")]
pub use ckpt_remote;
pub use ckpt_zero;

pub use ckpt_burn::checkpointers::CkptCheckpointers;
pub use ckpt_burn::stop::StopOnSignal;
pub use ckpt_burn::strategy::CkptTrainingStrategy;
pub use ckpt_burn::{CheckpointManager, DataCursor, ManagerConfig, ManagerReport, SaveTuning};
pub use ckpt_core::{EngineConfig, FrequencyPolicy, Retention};
