//! `ckpt-burn`: Burn 0.22.1 integration for burn-ckpt.
//!
//! - [`CheckpointManager`]: the checkpointer of a loop of one's own: `open`, `resume`,
//!   `step(..)` once per optimizer step (it decides by policy, snapshots and saves in the
//!   background), `finish`.
//! - [`FrozenState`]: capture model, optimizer, scheduler and trainer state at one
//!   optimizer-step boundary by cloning handles (copy-on-write), and turn it into a
//!   [`ckpt_core::Snapshot`] whose records are encoded on the persist thread.
//! - [`ResumableDataLoader`]: a Burn [`DataLoader`](burn::data::dataloader::DataLoader) whose
//!   order is a pure function of `(seed, epoch, shard)` and whose [`DataCursor`] is captured.
//! - [`restore`] / [`restore_latest`]: load model, optimizer, scheduler and `trainer.bin` back,
//!   with typed errors naming the file.
//! - [`checkpointers`]: a drop-in for `SupervisedTraining::with_custom_checkpointers` that
//!   publishes the three records of an epoch as one atomic checkpoint directory.
//! - [`strategy`]: a `TrainingStrategy::Custom` single-device loop that checkpoints through
//!   those checkpointers at optimizer-step boundaries and resumes mid-epoch.
//! - [`stop`]: opt-in SIGTERM/SIGINT handling that stops Burn's learner, or a loop through
//!   [`CheckpointManager`], at a step boundary with a final checkpoint.
//!
//! Files written (the layout in `docs/design.md`): `model.bpk` (byte-identical to
//! `model.into_record().save(..)`), `optim.bpk`, `scheduler.bpk`, `trainer.bin`.

mod capture;
pub mod checkpointers;
mod data;
mod encode;
mod error;
mod held;
mod learner_records;
mod manager;
mod pack;
mod param_ids;
mod pinned;
mod restore;
mod scratch;
mod stage;
mod state;
pub mod stop;
pub mod strategy;
mod submit;
mod tuning;
#[cfg(feature = "remote")]
mod upload;

pub use capture::{EncodedState, FrozenState, ModelStaging, save_memory};
pub use data::{ResumableDataLoader, backend_rng_lock, epoch_permutation, mix_seed, seeded_pass};
pub use encode::{
    MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, canonicalize_optimizer_bytes, encode_model,
    encode_optimizer, encode_scheduler, write_model_record, write_optimizer_record,
};
pub use error::{Error, Result};
pub use learner_records::{HeldLearner, LearnerRecords, LearnerTap};
pub use manager::{CheckpointManager, ManagerConfig, ManagerReport, ResumedFrom, UploadRecord};
pub use param_ids::{assign_param_ids, step_seed};
pub use pinned::{
    OptimizerRead, PinnedWait, UpdateWait, UpdateWaits, pinned_state_bytes, wait_pinned_at_most,
};
pub use restore::{
    Restored, latest_valid, load_model, load_model_bytes, load_optimizer, load_scheduler,
    load_trainer_state, read_verified_parts, restore, restore_latest,
};
pub use stage::STAGE_FAILPOINT;
pub use state::{DataCursor, TRAINER_FILE, TRAINER_STATE_VERSION, TrainerState};
pub use tuning::SaveTuning;
