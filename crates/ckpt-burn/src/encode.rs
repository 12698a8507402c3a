//! The parts of a checkpoint and their encodings: the model's record streamed tensor by
//! tensor, the optimizer's record in a canonical (name-sorted) layout, through a scratch file
//! ([`crate::scratch`]) on host memory, and the scheduler's record.

use std::{io::Write, path::PathBuf};

use burn::module::Module;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::optim::{ModuleOptimizer, OptimizerRecord};
use burn::store::ModuleRecord;

use crate::held::{collect_model, write_entries};
use crate::pack::write_pack;
use crate::scratch::{ScratchPath, ram_write_failed, scratch_path};
use crate::stage::{SchedulerSlot, encode_record};
use crate::{Error, Result};

/// File name of the model record (burnpack, what `model.into_record().save(..)` writes).
pub const MODEL_FILE: &str = "model.bpk";
/// File name of the optimizer record (burnpack, loadable with `OptimizerRecord::load`).
pub const OPTIM_FILE: &str = "optim.bpk";
/// File name of the scheduler record (burnpack, loadable with `LrSchedulerRecord::load`).
pub const SCHEDULER_FILE: &str = "scheduler.bpk";

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) fn record_err(part: &str, e: impl std::fmt::Display) -> Error {
    Error::Record {
        path: PathBuf::from(part),
        reason: e.to_string(),
    }
}

/// The encoded model record: burnpack bytes identical to `model.into_record().save(..)`.
pub fn encode_model<M: Module>(model: M) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_model(model, &mut out).map_err(|e| record_err(MODEL_FILE, e))?;
    Ok(out)
}

/// Streams `model`'s record into `sink`: the bytes of `model.into_record().save(..)`, drawn
/// one tensor at a time. `model` is dropped first, so a tensor the trainer has since replaced
/// is held only here, read without a copy and freed once written.
pub(crate) fn write_model<M: Module>(
    model: M,
    sink: &mut dyn Write,
) -> std::result::Result<u64, BoxError> {
    write_entries(collect_model(model, false).0, sink)
}

/// Streams `optim`'s record into `sink` in the canonical (name-sorted) layout. Burn's
/// `OptimizerRecord` is the only public view of optimizer state and materializes it whole;
/// it is encoded once (`into_bytes`) and streamed out. `optim` is dropped only once those
/// bytes are read: on CubeCL the record's data are lazy device reads, and a handle released
/// earlier lets the next optimizer update write in place into a buffer the record still has
/// to read.
pub(crate) fn write_optimizer(
    optim: ModuleOptimizer,
    sink: &mut dyn Write,
) -> std::result::Result<u64, BoxError> {
    write_canonical_optimizer(
        encode_record(Box::new(optim), &SchedulerSlot::default())?,
        sink,
    )
}

/// Streams Burn-encoded optimizer-record bytes (tensors in Burn's `HashMap` order) into `sink`
/// in the canonical (name-sorted) layout, without another buffer of the whole record.
pub(crate) fn write_canonical_optimizer(
    bytes: burn::tensor::Bytes,
    sink: &mut dyn Write,
) -> std::result::Result<u64, BoxError> {
    let reader = burn_pack::Reader::from_bytes(bytes)?;
    let metadata = reader.metadata().clone();
    let scalars = reader.scalars().clone();
    // The reader lists tensors by name: the canonical order.
    let tensors = reader.into_tensors()?;
    Ok(write_pack(tensors, &metadata, &scalars, sink)?)
}

/// Removes a scratch file when dropped (written, failed or abandoned).
pub(crate) struct ScratchFile(PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove a scratch file (start-up recovery removes it)");
        }
    }
}

/// Burn's `save` of a record of about `bytes` into a scratch file for a checkpoint under
/// `root` ([`crate::scratch`]: RAM where it has room), removed when the guard is dropped.
fn save_to_scratch(
    root: &std::path::Path,
    part: &str,
    step: u64,
    bytes: u64,
    save: impl FnOnce(&std::path::Path) -> std::result::Result<(), burn::store::RecordError>,
) -> std::result::Result<ScratchFile, BoxError> {
    let ScratchPath { path, in_ram } = scratch_path(root, part, step, bytes);
    let scratch = ScratchFile(path);
    save(&scratch.0).map_err(|e| {
        if in_ram {
            ram_write_failed(&scratch.0, &e);
        }
        format!("writing the scratch file {}: {e}", scratch.0.display())
    })?;
    Ok(scratch)
}

/// Streams Burn's `record` (about `bytes`) into `sink` in the canonical layout through a
/// scratch file ([`crate::scratch`]): `OptimizerRecord::save` writes the record out tensor by
/// tensor (each freed once written), then the file is read back in name order, a tensor at a
/// time, and removed. Only the bytes streamed into `sink` are part of the checkpoint; the
/// scratch file never is.
pub(crate) fn write_record_through_file(
    record: OptimizerRecord,
    bytes: u64,
    root: &std::path::Path,
    step: u64,
    sink: &mut dyn Write,
) -> std::result::Result<u64, BoxError> {
    let scratch = save_to_scratch(root, "optim", step, bytes, |p| record.save(p))?;
    let reader = burn_pack::Reader::from_file_exact(&scratch.0)?;
    let metadata = reader.metadata().clone();
    let scalars = reader.scalars().clone();
    // Name order: the canonical layout. Each tensor is read from the file as it is written.
    let tensors = reader.into_tensors()?;
    let written = write_pack(tensors, &metadata, &scalars, sink)?;
    drop(scratch);
    Ok(written)
}

/// Writes Burn's optimizer `record` (about `bytes`, which decides where its scratch file
/// goes) of a checkpoint of `step` under `root` into `sink` as `optim.bpk`'s bytes, in the
/// canonical (name-sorted) layout, without a buffer of the whole record. It goes out through a
/// scratch file, each tensor freed once written, and is read back a tensor at a time: in RAM
/// (`/dev/shm`) where that has room, else in `root` under a `.tmp-` name that start-up
/// recovery removes should the process die (see `docs/design.md`, "Scratch files"). Returns the
/// bytes written. The record's data must be host memory or still readable (on a device
/// backend, the buffers it reads must not have been overwritten yet).
pub fn write_optimizer_record(
    record: OptimizerRecord,
    bytes: u64,
    root: &std::path::Path,
    step: u64,
    sink: &mut dyn Write,
) -> Result<u64> {
    write_record_through_file(record, bytes, root, step, sink)
        .map_err(|e| record_err(OPTIM_FILE, e))
}

/// Writes Burn's model `record` (about `bytes`) into `sink`: `model.bpk`'s bytes, what
/// `model.into_record().save(..)` writes, through a scratch file as
/// [`write_optimizer_record`] does (`ModuleRecord::save` writes it out tensor by tensor, each
/// freed once written, and the file is copied into `sink` and removed). Returns the bytes
/// written.
pub fn write_model_record(
    record: ModuleRecord,
    bytes: u64,
    root: &std::path::Path,
    step: u64,
    sink: &mut dyn Write,
) -> Result<u64> {
    let copy = || -> std::result::Result<u64, BoxError> {
        let scratch = save_to_scratch(root, "model", step, bytes, |p| record.save(p))?;
        let mut file = std::fs::File::open(&scratch.0)?;
        // In 4 MiB pieces: the sink checksums and writes what it is given as it comes.
        let mut buf = vec![0u8; 4 << 20];
        let mut written = 0u64;
        loop {
            let n = std::io::Read::read(&mut file, &mut buf)?;
            if n == 0 {
                break;
            }
            sink.write_all(&buf[..n])?;
            written += n as u64;
        }
        drop(scratch);
        Ok(written)
    };
    copy().map_err(|e| record_err(MODEL_FILE, e))
}

/// Burn lays an optimizer record's tensor data out in `HashMap` iteration order, so two saves
/// of the same state differ byte for byte. Decoding and re-encoding sorts the tensors by name:
/// the canonical layout, loaded by Burn exactly like the original.
pub(crate) fn canonical_optimizer_bytes(
    record: OptimizerRecord,
) -> std::result::Result<burn::tensor::Bytes, burn::store::RecordError> {
    OptimizerRecord::from_bytes(record.into_bytes()?)?.into_bytes()
}

/// The encoded optimizer record, in the canonical (name-sorted) layout.
pub fn encode_optimizer(optim: &ModuleOptimizer) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_optimizer(optim.clone(), &mut out).map_err(|e| record_err(OPTIM_FILE, e))?;
    Ok(out)
}

/// Re-encodes optimizer-record bytes (for example a file Burn wrote) in the canonical layout
/// this crate writes, for byte comparisons.
pub fn canonicalize_optimizer_bytes(bytes: Vec<u8>) -> Result<Vec<u8>> {
    let record = OptimizerRecord::from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes))
        .map_err(|e| record_err(OPTIM_FILE, e))?;
    Ok(canonical_optimizer_bytes(record)
        .map_err(|e| record_err(OPTIM_FILE, e))?
        .to_vec())
}

/// The encoded scheduler record.
pub fn encode_scheduler(record: LrSchedulerRecord) -> Result<Vec<u8>> {
    let bytes = record
        .into_bytes()
        .map_err(|e| record_err(SCHEDULER_FILE, e))?;
    Ok(bytes.to_vec())
}
