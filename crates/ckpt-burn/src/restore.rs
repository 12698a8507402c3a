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
use ckpt_core::{CheckpointStatus, Manifest, list_checkpoints, read_manifest};

use crate::{Error, MODEL_FILE, OPTIM_FILE, Result, SCHEDULER_FILE, TRAINER_FILE, TrainerState};

/// Alignment Burn wants of a host buffer it adopts without copying
/// (`cubecl_environment::bytes::default_controller::MAX_ALIGN`, that of `u128`).
type AlignedWord = u128;
const WORD: usize = std::mem::size_of::<AlignedWord>();

/// Reads part `name` of checkpoint `dir` once, checking its size and checksum on the way, into
/// a buffer Burn takes over as is. `Bytes::from_bytes_vec` copies a `Vec<u8>` into a new
/// 16-byte-aligned allocation (which for a 1 GB state is a second gigabyte of fresh pages);
/// a buffer made of `u128`s already has that alignment, so the record's tensors are views into
/// the very pages the file was read into.
fn part_bytes(dir: &Path, manifest: &Manifest, name: &str) -> Result<Bytes> {
    let mut size = 0;
    let bytes = manifest.read_part_into(dir, name, |n| {
        size = n;
        Bytes::from_elems(vec![0 as AlignedWord; n.div_ceil(WORD)])
    })?;
    if bytes.len() == size {
        return Ok(bytes);
    }
    // Padded up to whole words: hand Burn a window of exactly the file's bytes.
    bytes.shared().view(0, size).map_err(|e| Error::Record {
        path: dir.join(name),
        reason: format!("cannot window the read buffer: {e:?}"),
    })
}

fn record_err(path: PathBuf, e: RecordError) -> Error {
    match e {
        RecordError::Validation(detail) => Error::ModelMismatch { path, detail },
        RecordError::Io(reason) => Error::Record { path, reason },
    }
}

/// The newest checkpoint in `root` that fully verifies (manifest, sizes, checksums), if any.
/// Read-only: unlike [`ckpt_core::recover`] it needs no writer lock and changes nothing.
/// Checks the newest first and stops at the first that verifies, so older checkpoints are not
/// read; [`restore_latest`] does the same while reading the files it restores (each byte once).
pub fn latest_valid(root: &Path) -> Result<Option<PathBuf>> {
    let list = list_checkpoints(root, false)?;
    for c in list.into_iter().rev() {
        if let CheckpointStatus::Invalid(reason) = &c.status {
            warn_invalid(&c.path, reason);
            continue;
        }
        match ckpt_core::verify_checkpoint(&c.path) {
            Ok(_) => return Ok(Some(c.path)),
            Err(e) => warn_invalid(&c.path, &e.to_string()),
        }
    }
    Ok(None)
}

fn warn_invalid(dir: &Path, reason: &str) {
    tracing::warn!(checkpoint = %dir.display(), %reason,
        "checkpoint is invalid; falling back to an older one");
}

/// Decodes and loads the model record in `bytes` (read from `path`).
fn apply_model<M: Module>(path: &Path, bytes: Bytes, model: M) -> Result<M> {
    let record = ModuleRecord::from_bytes(bytes).map_err(|e| Error::Record {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    model
        .try_load_record(record)
        .map_err(|e| record_err(path.to_path_buf(), e))
}

/// Decodes the optimizer record in `bytes` (read from `path`).
fn decode_optimizer(path: &Path, bytes: Bytes) -> Result<OptimizerRecord> {
    OptimizerRecord::from_bytes(bytes).map_err(|e| record_err(path.to_path_buf(), e))
}

/// Loads a decoded optimizer record (read from `path`) into `optim`.
fn apply_optimizer(
    path: &Path,
    record: OptimizerRecord,
    optim: ModuleOptimizer,
) -> Result<ModuleOptimizer> {
    // Burn panics on a record tensor without a parameter id; turn that into an error.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        optim.load_record(record)
    }))
    .map_err(|_| Error::Record {
        path: path.to_path_buf(),
        reason: "optimizer record is malformed (a tensor has no parameter id)".into(),
    })
}

/// Decodes and loads the scheduler record in `bytes` (read from `path`).
fn apply_scheduler(
    path: &Path,
    bytes: Bytes,
    scheduler: ModuleLrScheduler,
) -> Result<ModuleLrScheduler> {
    let record =
        LrSchedulerRecord::from_bytes(bytes).map_err(|e| record_err(path.to_path_buf(), e))?;
    Ok(scheduler.load_record(record))
}

/// Loads `model.bpk` from checkpoint `dir` into `model`. A model of another shape gives
/// [`Error::ModelMismatch`] naming the file, the tensor path and both shapes.
pub fn load_model<M: Module>(dir: &Path, model: M) -> Result<M> {
    let bytes = part_bytes(dir, &read_manifest(dir)?, MODEL_FILE)?;
    apply_model(&dir.join(MODEL_FILE), bytes, model)
}

/// Loads a model record from `bytes`, read from `path` (named in errors): for a model that
/// came over a collective rather than from a checkpoint directory.
pub fn load_model_bytes<M: Module>(path: &Path, bytes: Vec<u8>, model: M) -> Result<M> {
    apply_model(path, Bytes::from_bytes_vec(bytes), model)
}

/// Loads `optim.bpk` from checkpoint `dir` into `optim`. Load the model first.
pub fn load_optimizer(dir: &Path, optim: ModuleOptimizer) -> Result<ModuleOptimizer> {
    let path = dir.join(OPTIM_FILE);
    let bytes = part_bytes(dir, &read_manifest(dir)?, OPTIM_FILE)?;
    apply_optimizer(&path, decode_optimizer(&path, bytes)?, optim)
}

/// Loads `scheduler.bpk` from checkpoint `dir` into `scheduler`.
pub fn load_scheduler(dir: &Path, scheduler: ModuleLrScheduler) -> Result<ModuleLrScheduler> {
    let bytes = part_bytes(dir, &read_manifest(dir)?, SCHEDULER_FILE)?;
    apply_scheduler(&dir.join(SCHEDULER_FILE), bytes, scheduler)
}

/// Reads `trainer.bin` from checkpoint `dir`.
pub fn load_trainer_state(dir: &Path) -> Result<TrainerState> {
    let bytes = ckpt_core::read_part(dir, TRAINER_FILE)?;
    TrainerState::from_bytes(&bytes, &dir.join(TRAINER_FILE))
}

/// The verified bytes of every part a restore loads, each read once.
pub(crate) struct PartsRead {
    trainer: Vec<u8>,
    model: Bytes,
    optim: Bytes,
    scheduler: Bytes,
}

/// Reads and verifies every part of checkpoint `dir` exactly as [`restore`] does (each part
/// read once, its size and checksum checked while it is read), without decoding anything:
/// whether a checkpoint is restorable, and how fast its files can be read. Returns the bytes
/// read.
pub fn read_verified_parts(dir: &Path) -> Result<u64> {
    let p = read_parts(dir, true)?;
    Ok((p.trainer.len() + p.model.len() + p.optim.len() + p.scheduler.len()) as u64)
}

/// Reads and verifies (size, checksum) every part of checkpoint `dir` that a restore loads;
/// with `all_listed`, also verifies any other file its manifest lists, so that a success means
/// the checkpoint fully verifies. Only verification and I/O errors come from here, never a
/// decoding error.
pub(crate) fn read_parts(dir: &Path, all_listed: bool) -> Result<PartsRead> {
    let manifest = read_manifest(dir)?;
    // The optimizer state (two moments per parameter: about 2/3 of the bytes) is read on a
    // second thread while this one reads the rest; the errors are still reported in file
    // order (trainer, model, optimizer, scheduler).
    let (rest, optim) = std::thread::scope(|s| {
        let optim = s.spawn(|| part_bytes(dir, &manifest, OPTIM_FILE));
        let rest = (|| {
            let trainer = manifest.read_part_into(dir, TRAINER_FILE, |n| vec![0u8; n])?;
            let model = part_bytes(dir, &manifest, MODEL_FILE)?;
            let scheduler = part_bytes(dir, &manifest, SCHEDULER_FILE)?;
            Ok::<_, Error>((trainer, model, scheduler))
        })();
        let optim = optim.join().unwrap_or_else(|_| {
            Err(Error::Record {
                path: dir.join(OPTIM_FILE),
                reason: "the thread reading it panicked".into(),
            })
        });
        (rest, optim)
    });
    let (trainer, model, scheduler) = rest?;
    let optim = optim?;
    if all_listed {
        for f in &manifest.files {
            if ![TRAINER_FILE, MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE].contains(&f.name.as_str()) {
                manifest.verify_part(dir, &f.name)?;
            }
        }
    }
    Ok(PartsRead {
        trainer,
        model,
        optim,
        scheduler,
    })
}

/// Decodes and loads parts already read from checkpoint `dir`: the trainer state, then the
/// model, the optimizer and the scheduler.
fn apply_parts<M: Module>(
    dir: &Path,
    parts: PartsRead,
    model: M,
    optim: ModuleOptimizer,
    scheduler: ModuleLrScheduler,
) -> Result<Restored<M>> {
    let trainer = TrainerState::from_bytes(&parts.trainer, &dir.join(TRAINER_FILE))?;
    let model = apply_model(&dir.join(MODEL_FILE), parts.model, model)?;
    let optim_path = dir.join(OPTIM_FILE);
    let record = decode_optimizer(&optim_path, parts.optim)?;
    let optim = apply_optimizer(&optim_path, record, optim)?;
    let scheduler = apply_scheduler(&dir.join(SCHEDULER_FILE), parts.scheduler, scheduler)?;
    Ok(Restored {
        model,
        optim,
        scheduler,
        trainer,
        dir: dir.to_path_buf(),
    })
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

/// Restores all state from checkpoint `dir`: reads and verifies every part it loads (each
/// byte once), then decodes and loads the trainer state, the model, the optimizer and the
/// scheduler. A part that fails verification is reported, naming the file, before anything
/// is decoded.
pub fn restore<M: Module>(
    dir: &Path,
    model: M,
    optim: ModuleOptimizer,
    scheduler: ModuleLrScheduler,
) -> Result<Restored<M>> {
    let parts = read_parts(dir, false)?;
    apply_parts(dir, parts, model, optim, scheduler)
}

/// Restores from the newest valid checkpoint under `root`; `Ok(None)` if there is none.
///
/// Checkpoints are tried newest first. Each one's files are verified (manifest, sizes,
/// checksums) while they are read for the restore, so every byte is read once; one that fails
/// verification is skipped with a warning naming the file, and the next older one is tried, as
/// [`ckpt_core::recover`] does (this function changes nothing on disk). An error decoding or
/// loading a checkpoint that verified (a model of another shape, say) is returned as is.
pub fn restore_latest<M: Module>(
    root: &Path,
    model: M,
    optim: ModuleOptimizer,
    scheduler: ModuleLrScheduler,
) -> Result<Option<Restored<M>>> {
    for c in list_checkpoints(root, false)?.into_iter().rev() {
        if let CheckpointStatus::Invalid(reason) = &c.status {
            warn_invalid(&c.path, reason);
            continue;
        }
        // Only verification and I/O errors come from reading (as for `latest_valid`, any of
        // them makes the checkpoint invalid); decoding errors come from `apply_parts`.
        match read_parts(&c.path, true) {
            Ok(parts) => return apply_parts(&c.path, parts, model, optim, scheduler).map(Some),
            Err(e) => warn_invalid(&c.path, &e.to_string()),
        }
    }
    Ok(None)
}
