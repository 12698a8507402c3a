//! Restore: find the newest valid checkpoint and apply it, model first (the model record
//! restores the persisted ParamIds the optimizer state is keyed by), then the optimizer, then
//! the scheduler, then `trainer.bin`. Every part is checked against the manifest's size and
//! checksum before it is decoded; errors are typed and name the file.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::lr_scheduler::{LrSchedulerRecord, module_lr_scheduler::ModuleLrScheduler};
use burn::optim::{ModuleOptimizer, OptimizerRecord};
use burn::store::{ModuleRecord, RecordError};
use burn::tensor::Bytes;
use ckpt_core::{CheckpointStatus, list_checkpoints, read_part};

use crate::{Error, MODEL_FILE, OPTIM_FILE, Result, SCHEDULER_FILE, TRAINER_FILE, TrainerState};

fn part_bytes(dir: &Path, name: &str) -> Result<Bytes> {
    Ok(Bytes::from_bytes_vec(read_part(dir, name)?))
}

fn record_err(path: PathBuf, e: RecordError) -> Error {
    match e {
        RecordError::Validation(detail) => Error::ModelMismatch { path, detail },
        RecordError::Io(reason) => Error::Record { path, reason },
    }
}

/// The newest checkpoint in `root` that fully verifies (manifest, sizes, checksums), if any.
/// Read-only: unlike [`ckpt_core::recover`] it needs no writer lock and changes nothing.
pub fn latest_valid(root: &Path) -> Result<Option<PathBuf>> {
    let list = list_checkpoints(root, true)?;
    Ok(list
        .into_iter()
        .rev()
        .find(|c| c.status == CheckpointStatus::Verified)
        .map(|c| c.path))
}

/// Loads `model.bpk` from checkpoint `dir` into `model`. A model of another shape gives
/// [`Error::ModelMismatch`] naming the file, the tensor path and both shapes.
pub fn load_model<M: Module>(dir: &Path, model: M) -> Result<M> {
    let path = dir.join(MODEL_FILE);
    let record =
        ModuleRecord::from_bytes(part_bytes(dir, MODEL_FILE)?).map_err(|e| Error::Record {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    model
        .try_load_record(record)
        .map_err(|e| record_err(path, e))
}

/// Loads `optim.bpk` from checkpoint `dir` into `optim`. Load the model first.
pub fn load_optimizer(dir: &Path, optim: ModuleOptimizer) -> Result<ModuleOptimizer> {
    let path = dir.join(OPTIM_FILE);
    let record = OptimizerRecord::from_bytes(part_bytes(dir, OPTIM_FILE)?)
        .map_err(|e| record_err(path.clone(), e))?;
    // Burn panics on a record tensor without a parameter id; turn that into an error.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        optim.load_record(record)
    }))
    .map_err(|_| Error::Record {
        path,
        reason: "optimizer record is malformed (a tensor has no parameter id)".into(),
    })
}

/// Loads `scheduler.bpk` from checkpoint `dir` into `scheduler`.
pub fn load_scheduler(dir: &Path, scheduler: ModuleLrScheduler) -> Result<ModuleLrScheduler> {
    let path = dir.join(SCHEDULER_FILE);
    let record = LrSchedulerRecord::from_bytes(part_bytes(dir, SCHEDULER_FILE)?)
        .map_err(|e| record_err(path, e))?;
    Ok(scheduler.load_record(record))
}

/// Reads `trainer.bin` from checkpoint `dir`.
pub fn load_trainer_state(dir: &Path) -> Result<TrainerState> {
    let bytes = read_part(dir, TRAINER_FILE)?;
    TrainerState::from_bytes(&bytes, &dir.join(TRAINER_FILE))
}

/// Everything restored from one checkpoint.
pub struct Restored<M> {
    /// The model, with the checkpoint's parameters and ParamIds.
    pub model: M,
    /// The optimizer with its state.
    pub optim: ModuleOptimizer,
    /// The scheduler with its state.
    pub scheduler: ModuleLrScheduler,
    /// Step, epoch, data cursor, seeds.
    pub trainer: TrainerState,
    /// The checkpoint directory.
    pub dir: PathBuf,
}

impl<M> std::fmt::Debug for Restored<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Restored")
            .field("trainer", &self.trainer)
            .field("dir", &self.dir)
            .finish()
    }
}

/// Restores all state from checkpoint `dir`: model, then optimizer, then scheduler, then the
/// trainer state.
pub fn restore<M: Module>(
    dir: &Path,
    model: M,
    optim: ModuleOptimizer,
    scheduler: ModuleLrScheduler,
) -> Result<Restored<M>> {
    let trainer = load_trainer_state(dir)?;
    let model = load_model(dir, model)?;
    let optim = load_optimizer(dir, optim)?;
    let scheduler = load_scheduler(dir, scheduler)?;
    Ok(Restored {
        model,
        optim,
        scheduler,
        trainer,
        dir: dir.to_path_buf(),
    })
}

/// Restores from the newest valid checkpoint under `root`; `Ok(None)` if there is none.
pub fn restore_latest<M: Module>(
    root: &Path,
    model: M,
    optim: ModuleOptimizer,
    scheduler: ModuleLrScheduler,
) -> Result<Option<Restored<M>>> {
    match latest_valid(root)? {
        Some(dir) => restore(&dir, model, optim, scheduler).map(Some),
        None => Ok(None),
    }
}
