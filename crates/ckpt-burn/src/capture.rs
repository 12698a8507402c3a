//! Capture of Burn training state at one optimizer-step boundary.
//!
//! Burn tensors are reference-counted and copy-on-write: while a clone of a handle is alive,
//! the next update allocates a new buffer instead of writing in place. [`FrozenState::capture`]
//! therefore only clones the model, the [`ModuleOptimizer`] (handles), the scheduler record
//! (a few scalars) and the trainer state; that is the whole stall.
//!
//! The snapshot made by [`FrozenState::into_snapshot`] then *stages* the state to host memory
//! on a helper thread (`ckpt-stage`, one per training thread, started from it at its first save
//! so that it runs at the trainer's priority, not the persist thread's, and kept for the next
//! saves), from the moment an engine accepts the snapshot ([`Snapshot::on_accepted`]): at the
//! end of the save call, and not at all for a snapshot the engine skips. Where the state is
//! host memory (Flex), Burn's optimizer record is taken first (an eager copy, two thirds of
//! the state with AdamW) and the optimizer's handles are dropped as soon as it is, then each
//! model tensor is copied out and its handle dropped.
//! On a device backend the model's tensors are read in one batch ([`Transaction`]) enqueued on
//! the training thread's stream inside the save call, ahead of anything the trainer queues
//! next, and their handles are released there: the helper only waits for that read. Burn's
//! optimizer record is lazy device reads there, realized one tensor at a time; where
//! [`crate::OptimizerRead`] says so (by default on a device with one queue, such as wgpu) the
//! save call realizes them itself, before enqueuing the model's read, and releases the
//! optimizer's handles; elsewhere (CUDA) the helper does, after the model, and the handles
//! are kept until the record is encoded. Most of the state is thus released before the next
//! optimizer update, which then writes in place: no copy-on-write of held tensors, and on a
//! GPU no device memory held for the whole persist. The persist thread writes from the staged
//! copies (a tensor it reaches before the helper is drawn from its handle directly). The
//! snapshot still holds the step-k values (verified on Flex and on the CubeCL path through
//! wgpu). [`FrozenState::encode`] is the blocking path: the same bytes, produced on the calling
//! thread.
//!
//! Encoding streams ([`crate::pack::write_pack`]): the model's tensors are written one at a
//! time and each staged copy is freed once written. The optimizer record is Burn's only public
//! view of optimizer state, which it materializes whole. Where the state is host memory and
//! the snapshot knows the root's filesystem ([`FrozenState::with_scratch_dir`], which
//! [`FrozenState::submit`] sets), the writer streams it out through a scratch file in the root
//! (`OptimizerRecord::save`, tensor by tensor, each freed once written), then into the part in
//! the canonical name-sorted layout, a tensor at a time: a save then holds at most one copy of
//! the state, the model's staged tensors not yet written plus the record. Otherwise (a device
//! backend, whose record is lazy device reads that must be realized before the optimizer's
//! handles go; or no scratch directory) the record is encoded once (`into_bytes`), which in
//! Burn 0.22.1 needs the record's size once more for a moment: it fills one buffer, then
//! copies it into an aligned one (see [`save_memory`], whose `transient` counts it).
//!
//! The scratch file's durability contract: none. It is never part of a checkpoint; only the
//! bytes streamed from it into the part's sink (through the engine's [`ckpt_core::Storage`],
//! checksummed and synced there) are. It is removed once read (or when the write fails), and
//! start-up recovery removes one a crash left (its name starts with `.tmp-`).

use std::{io::Write, path::PathBuf, time::Instant};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::lr_scheduler::{LrSchedulerRecord, module_lr_scheduler::ModuleLrScheduler};
use burn::optim::{ModuleOptimizer, OptimizerRecord};
use burn::tensor::{Bool, ExecutionError, Int, Tensor, Transaction};
use ckpt_core::{Snapshot, session::SaveMemory, staging::ModelStaging};

use crate::data::mix_seed;
use crate::pack::write_pack;
use crate::pinned::Pin;
use crate::{Error, Result, TRAINER_FILE, TrainerState};

/// File name of the model record (burnpack, what `model.into_record().save(..)` writes).
pub const MODEL_FILE: &str = "model.bpk";
/// File name of the optimizer record (burnpack, loadable with `OptimizerRecord::load`).
pub const OPTIM_FILE: &str = "optim.bpk";
/// File name of the scheduler record (burnpack, loadable with `LrSchedulerRecord::load`).
pub const SCHEDULER_FILE: &str = "scheduler.bpk";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn record_err(part: &str, e: impl std::fmt::Display) -> Error {
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

/// A model tensor's handle clone, of any rank and kind.
trait HeldTensor: Send {
    /// Its bytes, read now (a lazy device read on CubeCL, a copy on Flex).
    fn draw(self: Box<Self>) -> burn::tensor::TensorData;
    /// Registers it, without autodiff, in `tx` (one batched eager read).
    fn register(self: Box<Self>, tx: Transaction) -> Transaction;
}

impl<const D: usize, K> HeldTensor for Tensor<D, K>
where
    K: burn::tensor::kind::Transaction + burn::tensor::kind::Autodiff,
    Tensor<D, K>: Send,
{
    fn draw(self: Box<Self>) -> burn::tensor::TensorData {
        (*self).into_data()
    }
    fn register(self: Box<Self>, tx: Transaction) -> Transaction {
        tx.register((*self).inner())
    }
}

/// The model's tensors read in one batch ([`read_model_eagerly`]): the read is enqueued on the
/// training thread's device stream at the capture, and whichever thread needs the bytes first
/// (the staging helper or the writer) waits for them and stages every slot.
struct EagerRead {
    pending: std::sync::Mutex<Option<PendingRead>>,
    slots: Vec<SharedSlot>,
}

/// The transaction's future, polled once (which enqueued the read).
type PendingRead = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = std::result::Result<Vec<burn::tensor::TensorData>, ExecutionError>,
            > + Send,
    >,
>;

impl EagerRead {
    /// Waits for the read (once; later calls find it done) and stages its bytes into the
    /// slots, or a failure that the writer reports.
    fn resolve(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(read) = pending.take() else {
            return;
        };
        let filled: Vec<Slot> = match burn::tensor::read_sync(read) {
            Ok(datas) if datas.len() == self.slots.len() => datas
                .into_iter()
                .map(|d| Slot::Staged(host_bytes(d.into_bytes())))
                .collect(),
            Ok(datas) => {
                let e = format!(
                    "the device read returned {} tensors for {}",
                    datas.len(),
                    self.slots.len()
                );
                self.slots.iter().map(|_| Slot::Failed(e.clone())).collect()
            }
            Err(e) => {
                let e = format!("reading the model from the device: {e:?}");
                self.slots.iter().map(|_| Slot::Failed(e.clone())).collect()
            }
        };
        for (slot, value) in self.slots.iter().zip(filled) {
            *lock_slot(slot) = value;
        }
    }
}

/// For a model on one device backend, enqueues one batched read of every model tensor still
/// held in `slots` on the calling (training) thread's stream, so it runs before anything the
/// trainer queues next, and releases the handles and their pins at once: the next update
/// writes the model in place however long the staging takes. The slots wait for the read
/// ([`EagerRead`]).
fn read_model_eagerly(slots: &[SharedSlot]) {
    let (mut batch, mut pins) = (Vec::new(), Vec::new());
    let mut tx = Transaction::default();
    for slot in slots {
        let mut guard = lock_slot(slot);
        match std::mem::replace(&mut *guard, Slot::Taken) {
            Slot::Held(tensor, pin) => {
                tx = tensor.register(tx);
                batch.push(slot.clone());
                pins.push(pin);
            }
            other => *guard = other,
        }
    }
    if batch.is_empty() {
        return;
    }
    let mut read: PendingRead = Box::pin(tx.execute_async());
    // The first poll enqueues the device-to-host copies (burn-cubecl submits them before its
    // first await) and drops the handles; it does not wait for the device.
    let polled = read
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    let eager = std::sync::Arc::new(EagerRead {
        pending: std::sync::Mutex::new(Some(match polled {
            std::task::Poll::Ready(out) => Box::pin(std::future::ready(out)),
            std::task::Poll::Pending => read,
        })),
        slots: batch,
    });
    for slot in &eager.slots {
        *lock_slot(slot) = Slot::Pending(eager.clone());
    }
    // The handles went with the first poll.
    drop(pins);
}

/// Locks `slot` once it no longer waits for a batched device read: the read is waited for
/// without the slot's lock, since it stages every slot of its batch.
fn lock_settled(slot: &SharedSlot) -> std::sync::MutexGuard<'_, Slot> {
    loop {
        let guard = lock_slot(slot);
        let Slot::Pending(read) = &*guard else {
            return guard;
        };
        let read = read.clone();
        drop(guard);
        read.resolve();
    }
}

/// Where one model tensor of a snapshot is: its handle (counted in
/// [`crate::pinned_state_bytes`] when the save is a background one), its staged host copy, or
/// already taken by the writer.
enum Slot {
    Held(Box<dyn HeldTensor>, Option<Pin>),
    /// In a batched device read enqueued at the capture (its handle already released).
    Pending(std::sync::Arc<EagerRead>),
    /// That read failed.
    Failed(String),
    Staged(burn::tensor::Bytes),
    Taken,
}

/// A slot shared by the writer and the staging helper.
type SharedSlot = std::sync::Arc<std::sync::Mutex<Slot>>;

fn lock_slot(slot: &SharedSlot) -> std::sync::MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Host bytes for `bytes`: a lazy device read (CubeCL) is forced into a host buffer of its own
/// so that nothing of the device allocation is kept.
fn host_bytes(bytes: burn::tensor::Bytes) -> burn::tensor::Bytes {
    if bytes.property() == burn::tensor::AllocationProperty::Device {
        burn::tensor::Bytes::from_bytes_vec(bytes.to_vec())
    } else {
        bytes
    }
}

/// Copies a held tensor to host memory and releases its handle (and its share of
/// [`crate::pinned_state_bytes`]); a slot in a batched device read waits for it, and one
/// already staged or taken is left as it is.
fn stage_slot(slot: &SharedSlot) {
    let mut guard = lock_settled(slot);
    match std::mem::replace(&mut *guard, Slot::Taken) {
        Slot::Held(held, pin) => {
            *guard = Slot::Staged(host_bytes(held.draw().into_bytes()));
            drop(pin);
        }
        other => *guard = other,
    }
}

/// One model tensor, named and ordered exactly as `Module::into_record` records it.
struct Entry {
    name: String,
    dtype: burn::tensor::DType,
    shape: burn::tensor::Shape,
    id: Option<u64>,
    len: usize,
    slot: SharedSlot,
}

impl Entry {
    /// The burnpack tensor whose bytes are taken from the slot when the writer draws it: the
    /// staged copy, else the handle, read now.
    fn into_pack_tensor(self) -> burn_pack::Tensor {
        let Entry {
            name,
            dtype,
            shape,
            id,
            len,
            slot,
        } = self;
        burn_pack::Tensor::deferred(name, dtype, shape, id, len, move || {
            let mut guard = lock_settled(&slot);
            match std::mem::replace(&mut *guard, Slot::Taken) {
                Slot::Staged(bytes) => Ok(bytes),
                Slot::Held(held, pin) => {
                    drop(guard);
                    let data = held.draw();
                    drop(pin);
                    Ok(data.into_bytes())
                }
                Slot::Failed(e) => Err(burn_pack::Error::IoError(e)),
                // A settled slot is never pending.
                Slot::Taken | Slot::Pending(_) => {
                    Err(burn_pack::Error::IoError("tensor drawn twice".into()))
                }
            }
        })
    }
}

/// Collects a module's parameters as [`Entry`]s holding handle clones, named and ordered
/// exactly as `Module::into_record` records them (module path, `on_save` form).
#[derive(Default)]
struct DeferredCollector {
    path: Vec<String>,
    entries: Vec<Entry>,
    /// Count each handle in [`crate::pinned_state_bytes`] until it is staged or drawn.
    pin: bool,
    /// The first parameter's device, and whether a later one was on another.
    device: Option<burn::tensor::Device>,
    several_devices: bool,
}

impl DeferredCollector {
    fn note_device(&mut self, device: burn::tensor::Device) {
        match &self.device {
            None => self.device = Some(device),
            Some(first) => self.several_devices |= *first != device,
        }
    }

    fn push(
        &mut self,
        id: ParamId,
        dtype: burn::tensor::DType,
        shape: Vec<usize>,
        held: Box<dyn HeldTensor>,
    ) {
        let name = self.path.join(".");
        let id = Some(id.val());
        let entry = if matches!(dtype, burn::tensor::DType::QFloat(_)) {
            // Packed quantized data has no size formula: take it now.
            let (bytes, shape, dtype) = held.draw().into_parts();
            let bytes = host_bytes(bytes);
            Entry {
                name,
                dtype,
                shape,
                id,
                len: bytes.len(),
                slot: std::sync::Arc::new(std::sync::Mutex::new(Slot::Staged(bytes))),
            }
        } else {
            let len = shape.iter().product::<usize>() * dtype.size();
            let pin = self.pin.then(|| Pin::new(len as u64));
            Entry {
                name,
                dtype,
                shape: shape.into(),
                id,
                len,
                slot: std::sync::Arc::new(std::sync::Mutex::new(Slot::Held(held, pin))),
            }
        };
        self.entries.push(entry);
    }
}

impl ModuleVisitor for DeferredCollector {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.transform_for_save().val();
        self.note_device(t.device());
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(t));
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        let t = param.transform_for_save().val();
        self.note_device(t.device());
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(t));
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        let t = param.transform_for_save().val();
        self.note_device(t.device());
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(t));
    }
}

/// `model`'s parameters as entries holding handle clones (counted in
/// [`crate::pinned_state_bytes`] when `pin`), and the device they all live on (`None` where
/// they live on several, or there are none). `model` is dropped, so a tensor the trainer has
/// since replaced is held only here.
fn collect_model<M: Module>(model: M, pin: bool) -> (Vec<Entry>, Option<burn::tensor::Device>) {
    let mut collector = DeferredCollector {
        pin,
        ..Default::default()
    };
    model.visit(&mut collector);
    drop(model);
    let device = collector.device.filter(|_| !collector.several_devices);
    (collector.entries, device)
}

/// Streams the model record of `entries` into `sink`: the bytes of
/// `model.into_record().save(..)`, one tensor at a time, each freed once written.
fn write_entries(entries: Vec<Entry>, sink: &mut dyn Write) -> std::result::Result<u64, BoxError> {
    let tensors = entries.into_iter().map(Entry::into_pack_tensor).collect();
    let none = std::collections::BTreeMap::new();
    Ok(write_pack(
        tensors,
        &none,
        &std::collections::BTreeMap::new(),
        sink,
    )?)
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
struct ScratchFile(PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove a scratch file (start-up recovery removes it)");
        }
    }
}

/// A scratch-file name unique in this process, under the `.tmp-` prefix start-up recovery
/// removes.
fn scratch_name(step: u64) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".tmp-optim-{step:08}-{}-{n}.bpk", std::process::id())
}

/// Streams Burn's `record` into `sink` in the canonical layout through a scratch file in
/// `dir`: `OptimizerRecord::save` writes the record out tensor by tensor (each freed once
/// written), then the file is read back in name order, a tensor at a time, and removed. Only
/// the bytes streamed into `sink` are part of the checkpoint; the scratch file never is.
fn write_record_through_file(
    record: OptimizerRecord,
    dir: &std::path::Path,
    step: u64,
    sink: &mut dyn Write,
) -> std::result::Result<u64, BoxError> {
    let scratch = ScratchFile(dir.join(scratch_name(step)));
    record
        .save(&scratch.0)
        .map_err(|e| format!("writing the scratch file {}: {e}", scratch.0.display()))?;
    let reader = burn_pack::Reader::from_file_exact(&scratch.0)?;
    let metadata = reader.metadata().clone();
    let scalars = reader.scalars().clone();
    // Name order: the canonical layout. Each tensor is read from the file as it is written.
    let tensors = reader.into_tensors()?;
    let written = write_pack(tensors, &metadata, &scalars, sink)?;
    drop(scratch);
    Ok(written)
}

/// Failpoint (the `fail` crate, compiled in only where `fail/failpoints` is enabled) at the
/// start of a background save's staging helper: tests hold staging back with `sleep(ms)` so
/// that the persist reads handles the trainer has moved past.
pub const STAGE_FAILPOINT: &str = "ckpt_burn::stage";

/// A background save's staging, run on the calling thread's `ckpt-stage` helper once an engine
/// accepts the snapshot (or inline by the writer, where no thread can be started).
struct Staging {
    state: std::sync::Mutex<StageState>,
    /// Whether it was handed to a staging thread (once).
    queued: std::sync::atomic::AtomicBool,
    /// The job's [`StageJob::model_written`], opened when the writer asks for the record (it
    /// writes the model part first, but a wait must never outlast that request).
    model_written: Option<std::sync::Arc<ModelWritten>>,
}

/// What the helper is given: the model's slots, and the optimizer's handles with their pin or
/// its record already read and encoded inside the save call ([`crate::OptimizerRead`]).
struct StageJob {
    slots: Vec<SharedSlot>,
    optim: OptimState,
    /// Whether the model's parameters all live on one host-memory device (Flex), known at the
    /// capture: Burn's optimizer record is then an eager host copy.
    host: bool,
    /// Whether to stage the model's tensors, or leave them to the writer (which draws each from
    /// its handle as it writes it) for a save the trainer waits on.
    stage_model: bool,
    /// Where set, Burn's record is encoded only once the model part is written (or the writer
    /// asks for the record): see [`StageJob::run`].
    model_written: Option<std::sync::Arc<ModelWritten>>,
    /// Where a learner's scheduler record goes when its optimizer record is taken.
    scheduler: SchedulerSlot,
    /// Whether Burn's record of host-memory state goes to the writer as it is (written through
    /// a scratch file), instead of being encoded here.
    record_to_writer: bool,
}

/// Opens once a save's model part is written (or dropped unwritten), or once the writer asks
/// for the optimizer record, whichever comes first.
#[derive(Default)]
struct ModelWritten {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl ModelWritten {
    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let _open = self
            .opened
            .wait_while(open, |open| !*open)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Opens a [`ModelWritten`] when dropped: held by the model part, so that it opens whether the
/// part is written, fails, or is dropped without being written.
struct OpenWhenDropped(std::sync::Arc<ModelWritten>);

impl Drop for OpenWhenDropped {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// What a staging job produces: Burn's optimizer record, encoded.
type StageResult = std::result::Result<OptimOut, BoxError>;

/// The optimizer's part as the staging job hands it to the writer.
enum OptimOut {
    /// Burn's record, encoded (`into_bytes`).
    Encoded(burn::tensor::Bytes),
    /// Burn's record of host-memory state, for the writer to stream through a scratch file
    /// ([`write_record_through_file`]): no buffer of the whole record, no second copy.
    Record(OptimizerRecord),
}

/// A staging job not yet started, running on the staging thread (whose result arrives on the
/// receiver), or its result taken by the optimizer part.
enum StageState {
    Waiting(StageJob),
    Running(std::sync::mpsc::Receiver<StageResult>),
    Taken,
}

impl StageJob {
    /// Stages the model's tensors to host memory and takes and encodes Burn's record of the
    /// optimizer, releasing each handle as soon as its bytes are on the host, so that as much
    /// of the state as possible is released before the next optimizer update.
    ///
    /// - Host state (Flex): the record is taken first. `to_record` copies the moments out
    ///   eagerly, so the optimizer's handles (two thirds of the state with AdamW) are released
    ///   as soon as it returns; the model's tensors are staged next, then the record encoded.
    /// - Device state (CubeCL), or where that is unknown: the model goes first (on CubeCL its
    ///   read was enqueued at the capture, so this only waits for it), since each tensor staged
    ///   releases its handle at once. The record's data are lazy device reads there, so the
    ///   optimizer's handles are kept until the record is encoded: a handle released earlier
    ///   would let the next update write in place into a buffer the record still has to read.
    /// - A record the save call already read and encoded ([`crate::OptimizerRead`]): only the
    ///   model is left to stage.
    ///
    /// Burn 0.22.1's `into_bytes` holds the record's bytes twice for a moment (see
    /// [`save_memory`]). On host memory, while training goes on, it therefore waits until the
    /// model part is written ([`StageJob::model_written`]): the staged model (or the old
    /// buffers of a held one that an update copied on write) is freed by then, instead of
    /// adding to that moment, the save's peak.
    fn run(self) -> StageResult {
        fail::fail_point!(STAGE_FAILPOINT);
        let StageJob {
            slots,
            optim,
            host,
            stage_model,
            model_written,
            scheduler,
            record_to_writer,
        } = self;
        let t0 = Instant::now();
        let optim = match optim {
            // Host state: the record first, and the optimizer's handles and pin go with it.
            OptimState::Held(optim, pin) if host => {
                let record = take_records(optim.as_ref(), &scheduler)?;
                drop((optim, pin));
                OptimState::Recorded(record)
            }
            // Read inside the save call (only the model is left to stage), or device handles.
            other => other,
        };
        let t_early = t0.elapsed();
        if stage_model {
            for slot in &slots {
                stage_slot(slot);
            }
        }
        drop(slots);
        let t_model = t0.elapsed();
        let out = match optim {
            OptimState::Encoded(bytes) => OptimOut::Encoded(bytes?),
            // The writer streams it out once it gets to the optimizer part.
            OptimState::Recorded(record) if record_to_writer => OptimOut::Record(record),
            OptimState::Recorded(record) => {
                if let Some(written) = model_written {
                    written.wait();
                }
                OptimOut::Encoded(record.into_bytes()?)
            }
            OptimState::Held(optim, pin) => {
                let bytes = encode_record(optim, &scheduler)?;
                drop(pin);
                OptimOut::Encoded(bytes)
            }
        };
        tracing::debug!(
            record_first_ms = t_early.as_secs_f64() * 1e3,
            model_ms = (t_model - t_early).as_secs_f64() * 1e3,
            rest_ms = (t0.elapsed() - t_model).as_secs_f64() * 1e3,
            host,
            "staged a save: the model's tensors, Burn's optimizer record, its bytes"
        );
        Ok(out)
    }
}

/// The optimizer's state on the staging helper: its record read and encoded inside the save
/// call ([`crate::OptimizerRead`], or the error that made), Burn's record already taken (its
/// handles released), or the handles, counted in [`crate::pinned_state_bytes`] by their pin.
enum OptimState {
    Encoded(std::result::Result<burn::tensor::Bytes, BoxError>),
    Recorded(OptimizerRecord),
    Held(Box<dyn OptimizerSource>, Pin),
}

/// Where a frozen state's optimizer record comes from: a [`ModuleOptimizer`]'s handle clones,
/// or a frozen Burn learner ([`crate::learner_records`]), which also gives the scheduler's
/// record. Whatever it holds is released when it is dropped.
pub(crate) trait OptimizerSource: Send {
    /// Burn's optimizer record (and the scheduler's, where the source holds the scheduler),
    /// taken now on the calling thread.
    fn records(
        &self,
    ) -> std::result::Result<(OptimizerRecord, Option<LrSchedulerRecord>), BoxError>;
}

impl OptimizerSource for ModuleOptimizer {
    fn records(
        &self,
    ) -> std::result::Result<(OptimizerRecord, Option<LrSchedulerRecord>), BoxError> {
        Ok((self.to_record(), None))
    }
}

/// The scheduler record of a frozen learner, put here by whoever takes its optimizer record
/// (the staging helper, the save call, or the writer) and taken by the scheduler part, which
/// the engine writes after the optimizer part.
type SchedulerSlot = std::sync::Arc<std::sync::Mutex<Option<LrSchedulerRecord>>>;

/// Burn's record of `source`, with the scheduler's where it has one (into `scheduler`).
fn take_records(
    source: &dyn OptimizerSource,
    scheduler: &SchedulerSlot,
) -> std::result::Result<OptimizerRecord, BoxError> {
    let (record, sched) = source.records()?;
    if let Some(sched) = sched {
        *scheduler.lock().unwrap_or_else(|e| e.into_inner()) = Some(sched);
    }
    Ok(record)
}

/// Burn's record of `source`, encoded; `source` (its handles) is dropped only once the bytes
/// are read (see [`write_optimizer`]).
fn encode_record(
    source: Box<dyn OptimizerSource>,
    scheduler: &SchedulerSlot,
) -> std::result::Result<burn::tensor::Bytes, BoxError> {
    let bytes = take_records(source.as_ref(), scheduler)?.into_bytes()?;
    drop(source);
    Ok(bytes)
}

impl Staging {
    fn new(job: StageJob) -> Self {
        Self {
            model_written: job.model_written.clone(),
            state: std::sync::Mutex::new(StageState::Waiting(job)),
            queued: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StageState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the staging to the calling thread's staging thread, started on first use so that
    /// it inherits the calling thread's scheduling priority (once; a later call does nothing).
    /// Where no thread can be started, the writer stages when it gets to the optimizer part.
    fn start(self: &std::sync::Arc<Self>) {
        if !self.queued.swap(true, std::sync::atomic::Ordering::AcqRel) {
            stage_on_helper(self.clone());
        }
    }

    /// Runs the job on the staging thread, unless the writer has taken it already.
    fn run_here(&self) {
        let mut state = self.lock();
        let job = match std::mem::replace(&mut *state, StageState::Taken) {
            StageState::Waiting(job) => job,
            other => {
                *state = other;
                return;
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        *state = StageState::Running(rx);
        drop(state);
        // A closed receiver means the save was dropped: nobody wants the result.
        let _ = tx.send(job.run());
    }

    /// The encoded optimizer record: the staging thread's, or staged and encoded now if that
    /// thread has not started on it.
    fn bytes(&self) -> StageResult {
        if let Some(written) = &self.model_written {
            written.open();
        }
        let state = std::mem::replace(&mut *self.lock(), StageState::Taken);
        match state {
            StageState::Waiting(job) => job.run(),
            StageState::Running(rx) => rx
                .recv()
                .map_err(|_| BoxError::from("the staging thread panicked"))?,
            StageState::Taken => Err("the optimizer record was taken twice".into()),
        }
    }
}

thread_local! {
    /// The calling thread's staging thread (`ckpt-stage`), started at its first save and kept
    /// for the next: starting a thread at every save cost the training thread up to a few
    /// milliseconds of its stall on a busy machine. It exits when the calling thread does.
    static STAGER: std::cell::RefCell<Option<std::sync::mpsc::Sender<std::sync::Arc<Staging>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Queues `staging` on the calling thread's staging thread, starting it if there is none (or
/// the last one died with a panic). Jobs run in the order queued.
fn stage_on_helper(staging: std::sync::Arc<Staging>) {
    STAGER.with(|stager| {
        let mut stager = stager.borrow_mut();
        let mut staging = staging;
        for _ in 0..2 {
            if stager.is_none() {
                *stager = start_stager();
            }
            let Some(tx) = stager.as_ref() else {
                return;
            };
            match tx.send(staging) {
                Ok(()) => return,
                Err(back) => {
                    staging = back.0;
                    *stager = None;
                }
            }
        }
    });
}

/// Starts a staging thread; `None` (said at debug level) where the system refuses.
fn start_stager() -> Option<std::sync::mpsc::Sender<std::sync::Arc<Staging>>> {
    let (tx, rx) = std::sync::mpsc::channel::<std::sync::Arc<Staging>>();
    let spawned = std::thread::Builder::new()
        .name("ckpt-stage".into())
        .spawn(move || {
            // At the trainer's nice value, but woken at every save without preempting it.
            if !ckpt_core::priority::batch_current_thread() {
                tracing::debug!("the staging thread keeps the default scheduling policy");
            }
            for staging in rx {
                staging.run_here();
            }
        });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::debug!(error = %e, "no staging thread: the state is read by the persist thread");
            None
        }
    }
}

/// Burn lays an optimizer record's tensor data out in `HashMap` iteration order, so two saves
/// of the same state differ byte for byte. Decoding and re-encoding sorts the tensors by name:
/// the canonical layout, loaded by Burn exactly like the original.
fn canonical_optimizer_bytes(
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

/// The peak extra memory of saving a model of `model` bytes with an optimizer record of
/// `optim_bytes` (`None`: two moments per parameter, AdamW), by route.
pub fn save_memory(model: u64, optim_bytes: Option<u64>) -> SaveMemory {
    let optim = optim_bytes.unwrap_or(2 * model);
    SaveMemory {
        // The staging helper takes Burn's record of the moments (`to_record` copies them out)
        // and releases the optimizer's handles, and copies the model's tensors out (or, held,
        // an update copies them on write). One copy of the state at most, each part freed as it
        // is written; more only when an update runs before the helper got to a tensor.
        background: model + optim,
        // While the trainer waits nothing is replaced, and a snapshot made for that
        // ([`FrozenState::into_snapshot_waited`]) copies the model's tensors out one at a time as
        // they are written; the optimizer record is materialized whole whatever the route:
        // Burn's API has no smaller view of it.
        blocking: optim,
        // `OptimizerRecord::into_bytes` fills one buffer as it frees the record, then copies
        // that buffer once more: burn-pack's `Writer::into_bytes` hands its `Vec<u8>` to
        // `Bytes::from_bytes_vec`, which in cubecl 0.11 re-allocates every `Vec<u8>` to a
        // 16-byte alignment (it checks the layout's alignment, 1, not the pointer's). For a
        // moment the record's bytes are in memory twice.
        transient: optim,
    }
}

/// Sums parameter bytes without reading data.
struct SizeCounter(u64);

impl SizeCounter {
    fn add(&mut self, dtype: burn::tensor::DType, shape: burn::tensor::Shape) {
        self.0 += (shape.iter().product::<usize>() * dtype.size()) as u64;
    }
}

impl ModuleVisitor for SizeCounter {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val();
        self.add(t.dtype(), t.shape());
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        let t = param.val();
        self.add(t.dtype(), t.shape());
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        let t = param.val();
        self.add(t.dtype(), t.shape());
    }
}

/// Training state frozen at one step boundary: handle clones, not bytes.
pub struct FrozenState<M> {
    model: M,
    optim: Box<dyn OptimizerSource>,
    /// Bytes the optimizer source holds beyond the optimizer's state (a frozen learner also
    /// holds the model's handles until its records are taken).
    source_extra: u64,
    /// The scheduler's record, taken at the capture, or (a frozen learner) with the optimizer's.
    scheduler: SchedulerState,
    trainer: TrainerState,
    capture_time: std::time::Duration,
    /// [`FrozenState::model_bytes`], counted on first use (the trainer asks for it twice).
    model_bytes: std::cell::OnceCell<u64>,
    /// When a background snapshot reads the optimizer's state from a device.
    optimizer_read: crate::OptimizerRead,
    /// Whether a background snapshot of host-memory state stages the model or holds it.
    model_staging: ModelStaging,
    /// Where the writer may put a scratch file (the checkpoint root's filesystem).
    scratch_dir: Option<PathBuf>,
}

impl<M> std::fmt::Debug for FrozenState<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrozenState")
            .field("trainer", &self.trainer)
            .field("capture_time", &self.capture_time)
            .finish()
    }
}

/// A frozen state's scheduler record: taken at the capture, or (a frozen learner, whose
/// scheduler Burn keeps private) taken with the optimizer's record into a slot.
enum SchedulerState {
    Record(LrSchedulerRecord),
    WithOptimizer,
}

impl SchedulerState {
    /// The record, from the slot where it comes with the optimizer's.
    fn into_record(self, slot: &SchedulerSlot) -> std::result::Result<LrSchedulerRecord, BoxError> {
        match self {
            SchedulerState::Record(r) => Ok(r),
            SchedulerState::WithOptimizer => slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .ok_or_else(|| {
                    "the learner's scheduler record was not taken: its optimizer record was not \
                     read before the scheduler part"
                        .into()
                }),
        }
    }
}

/// The four files of a checkpoint, encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedState {
    /// Step.
    pub step: u64,
    /// Epoch.
    pub epoch: u64,
    /// `model.bpk`.
    pub model: Vec<u8>,
    /// `optim.bpk`.
    pub optim: Vec<u8>,
    /// `scheduler.bpk`.
    pub scheduler: Vec<u8>,
    /// `trainer.bin`.
    pub trainer: Vec<u8>,
}

impl EncodedState {
    /// A snapshot with owned-bytes parts.
    pub fn into_snapshot(self) -> Snapshot {
        Snapshot::new(self.step)
            .with_epoch(self.epoch)
            .with_bytes(MODEL_FILE, self.model)
            .with_bytes(OPTIM_FILE, self.optim)
            .with_bytes(SCHEDULER_FILE, self.scheduler)
            .with_bytes(TRAINER_FILE, self.trainer)
    }
}

impl<M: Module + 'static> FrozenState<M> {
    /// Freezes the state: clones the model and optimizer handles and takes the scheduler
    /// record. Cost: cloning handles (tens of microseconds), independent of the model size.
    pub fn capture(
        model: &M,
        optim: &ModuleOptimizer,
        scheduler: &ModuleLrScheduler,
        trainer: TrainerState,
    ) -> Self {
        let t0 = Instant::now();
        let model = model.clone();
        let optim = optim.clone();
        let scheduler = scheduler.to_record();
        Self::frozen(
            model,
            Box::new(optim),
            0,
            SchedulerState::Record(scheduler),
            trainer,
            t0,
        )
    }

    fn frozen(
        model: M,
        optim: Box<dyn OptimizerSource>,
        source_extra: u64,
        scheduler: SchedulerState,
        trainer: TrainerState,
        t0: Instant,
    ) -> Self {
        Self {
            model,
            optim,
            source_extra,
            scheduler,
            trainer,
            capture_time: t0.elapsed(),
            model_bytes: std::cell::OnceCell::new(),
            optimizer_read: crate::OptimizerRead::default(),
            model_staging: ModelStaging::Stage,
            scratch_dir: None,
        }
    }

    /// Lets a background snapshot of host-memory state write Burn's optimizer record through
    /// a scratch file in `dir` (a directory on the checkpoint root's filesystem; the engine's
    /// root, where start-up recovery removes a `.tmp-*` file a crash left): Burn's public
    /// `OptimizerRecord::save` streams the record out tensor by tensor, each freed as written,
    /// where `into_bytes` would hold it twice more for a moment (one buffer of the whole
    /// record, and in cubecl-environment 0.11.3 a realigned copy of it). The writer then
    /// streams the file into the part in the canonical layout and removes it. Costs one more
    /// write and read of the record through the page cache (and Burn syncs that file).
    pub fn with_scratch_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch_dir = Some(dir.into());
        self
    }

    /// Freezes a Burn learner's state: clones the learner (handle clones; its model, optimizer
    /// and scheduler stay those of this step however far training goes on). Burn keeps the
    /// learner's optimizer and scheduler private: their records are taken from the clone later,
    /// through `tap` (Burn's own `LearningCheckpointer`, see [`crate::LearnerTap`]), on the
    /// staging helper of a background save.
    pub fn capture_learner(
        learner: &burn::train::Learner<M>,
        tap: &crate::LearnerTap<M>,
        trainer: TrainerState,
    ) -> Self
    where
        M: burn::train::LearnerModel,
    {
        let t0 = Instant::now();
        let frozen = crate::learner_records::FrozenLearner {
            learner: learner.clone(),
            tap: tap.clone(),
        };
        let model = learner.model();
        let mut state = Self::frozen(
            model,
            Box::new(frozen),
            0,
            SchedulerState::WithOptimizer,
            trainer,
            t0,
        );
        // The clone holds the model's handles too, until its records are taken.
        state.source_extra = state.model_bytes();
        state.capture_time = t0.elapsed();
        state
    }

    /// Sets how a background snapshot takes the model's tensors off the training state where
    /// they are host memory (Flex; default [`ModelStaging::Stage`]): copied out at once by the
    /// staging helper, or held for the writer, which reads each as it writes it (an update in
    /// between copies it on write, and the writer then reads the old buffer without a copy).
    /// Either way the snapshot keeps the captured step's values. On a device backend the
    /// model is always staged: held handles would keep device memory.
    /// [`ckpt_core::MemoryGate::model_staging`] picks it per save by its measured cost.
    pub fn with_model_staging(mut self, staging: ModelStaging) -> Self {
        self.model_staging = staging;
        self
    }

    /// Sets when a background snapshot of state on a device backend reads the optimizer's
    /// state to host memory (default [`crate::OptimizerRead::Auto`]): inside the save call, or
    /// on the staging helper after it.
    pub fn with_optimizer_read(mut self, read: crate::OptimizerRead) -> Self {
        self.optimizer_read = read;
        self
    }

    /// The trainer state captured.
    pub fn trainer(&self) -> &TrainerState {
        &self.trainer
    }

    /// Time [`Self::capture`] took on the calling thread.
    pub fn capture_time(&self) -> std::time::Duration {
        self.capture_time
    }

    /// A snapshot whose model and optimizer parts are staged to host memory by the calling
    /// thread's staging thread once an engine accepts it (see the module docs) and written
    /// later by the persist thread. The time spent here (collecting the handles) is added to
    /// the capture time, recorded as the snapshot's stall. The parts declare what they hold
    /// ([`Snapshot::holding`]) for an optimizer record of the AdamW size; see
    /// [`Self::into_snapshot_sized`].
    pub fn into_snapshot(self) -> Snapshot {
        self.into_snapshot_sized(None)
    }

    /// [`Self::into_snapshot`] for an optimizer record of `optim_bytes` (the previous
    /// checkpoint's; `None`: two moments per parameter). The model part holds the model's
    /// bytes until written (staged copies, or handles an update copies on write); the optimizer
    /// part holds the record until written (Burn's `to_record` copies the moments out and its
    /// `into_bytes` moves them into one buffer: the public API has no streaming path).
    pub fn into_snapshot_sized(self, optim_bytes: Option<u64>) -> Snapshot {
        self.into_snapshot_waited(None, optim_bytes)
    }

    /// [`Self::into_snapshot_sized`] for a save after whose submit the trainer waits until the
    /// bytes held are at most `wait_limit` (`None`: it does not wait; `Some(0)`: it waits for
    /// the whole save). While the trainer waits nothing is replaced, so a model tensor written
    /// by then is read from its handle as it is written, without staging. The model is staged
    /// at once unless the trainer waits for all of it to be written (a limit no larger than the
    /// optimizer record, which stays held until its own part is written): what is left of it
    /// when training goes on would otherwise be copied on write, or unless the state is host
    /// memory and [`Self::with_model_staging`] says to hold it. The optimizer record is taken
    /// on the helper thread either way, beside the writer.
    pub fn into_snapshot_waited(
        self,
        wait_limit: Option<u64>,
        optim_bytes: Option<u64>,
    ) -> Snapshot {
        let model_bytes = self.model_bytes();
        let optim_bytes = optim_bytes.unwrap_or(2 * model_bytes);
        let waited_for_model = wait_limit.is_some_and(|limit| limit <= optim_bytes);
        let Self {
            model,
            optim,
            source_extra,
            scheduler,
            trainer,
            capture_time,
            optimizer_read,
            model_staging,
            scratch_dir,
            ..
        } = self;
        let sched_slot = SchedulerSlot::default();
        let t0 = Instant::now();
        // Staging starts when the engine accepts the snapshot, on this (the trainer's) thread's
        // staging thread, at its priority: the optimizer's record is taken and the model's
        // tensors copied out, each handle released as soon as it can be (see
        // [`StageJob::run`]), while the persist thread writes the model from the staged
        // copies. The start is idempotent: the model part tries again, for an engine that
        // writes the snapshot without accepting it for its persist thread.
        let (entries, device) = collect_model(model, true);
        let slots: Vec<SharedSlot> = entries.iter().map(|e| e.slot.clone()).collect();
        // Where the model lives, asked once (a server call on CubeCL): `None` on several
        // devices or none, else whether it is device memory.
        let on_device = device.as_ref().map(crate::pinned::holds_device_memory);
        let host = on_device == Some(false);
        // A held model (host memory, Hold) is written from its handles; otherwise it is staged,
        // unless the trainer already waited for it.
        let held = host && model_staging == ModelStaging::Hold;
        let stage_model = !(waited_for_model || held);
        // `on_device` already asked the backend whether it holds device memory.
        let read_now = on_device == Some(true)
            && device
                .as_ref()
                .is_some_and(|d| optimizer_read.on_device_backend(d));
        let optim = if read_now {
            // Read now, ahead of anything the trainer queues next, and before the model's read
            // is enqueued (the wait is for the optimizer's bytes alone); its handles go at once.
            let t_read = Instant::now();
            let bytes = encode_record(optim, &sched_slot);
            tracing::debug!(
                ms = t_read.elapsed().as_secs_f64() * 1e3,
                "read the optimizer's record inside the save call"
            );
            OptimState::Encoded(bytes)
        } else {
            OptimState::Held(optim, Pin::new(optim_bytes + source_extra))
        };
        if stage_model && on_device == Some(true) {
            // On a device backend the model's reads are enqueued now, ahead of the next step.
            read_model_eagerly(&slots);
        }
        // On host memory, while training goes on, Burn's record is encoded only once the model
        // is written (see [`StageJob::run`]); a save the trainer waits for copies nothing on
        // write, and its model is not staged.
        let model_written =
            (host && !waited_for_model).then(|| std::sync::Arc::new(ModelWritten::default()));
        let written_mark = model_written.clone().map(OpenWhenDropped);
        let staging = std::sync::Arc::new(Staging::new(StageJob {
            slots,
            optim,
            host,
            stage_model,
            model_written,
            scheduler: sched_slot.clone(),
            record_to_writer: host && scratch_dir.is_some(),
        }));
        let starter = staging.clone();
        let on_accepted = staging.clone();
        let model_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            starter.start();
            let written = write_entries(entries, sink).map(drop);
            drop(written_mark);
            written
        };
        let step = trainer.step;
        let optim_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            match staging.bytes()? {
                OptimOut::Encoded(bytes) => write_canonical_optimizer(bytes, sink).map(drop),
                OptimOut::Record(record) => match &scratch_dir {
                    Some(dir) => write_record_through_file(record, dir, step, sink).map(drop),
                    None => write_canonical_optimizer(record.into_bytes()?, sink).map(drop),
                },
            }
        };
        let sched_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            let bytes = scheduler.into_record(&sched_slot)?.into_bytes()?;
            sink.write_all(&bytes)?;
            Ok(())
        };
        let snap = Snapshot::new(trainer.step)
            .with_epoch(trainer.epoch)
            .with_producer(MODEL_FILE, model_part)
            // Each tensor's staged copy (or, on a route the trainer waits on, the copy drawn
            // from its handle) is dropped once written.
            .holding_released_as_written(model_bytes)
            .with_producer(OPTIM_FILE, optim_part)
            .holding(optim_bytes)
            .with_producer(SCHEDULER_FILE, sched_part)
            .with_bytes(TRAINER_FILE, trainer.to_bytes())
            // Staged once the engine takes it (not for a snapshot it skips), at the end of the
            // save call, so the staging thread does not compete with the rest of that call.
            .on_accepted(move || on_accepted.start());
        snap.with_capture_time(capture_time + t0.elapsed())
    }

    /// Visits the frozen model's parameters.
    pub(crate) fn model_visit<V: ModuleVisitor>(&self, visitor: &mut V) {
        self.model.visit(visitor);
    }

    /// Bytes of the model's parameters (shapes times dtype sizes; no data is read).
    pub fn model_bytes(&self) -> u64 {
        *self.model_bytes.get_or_init(|| {
            let mut c = SizeCounter(0);
            self.model.visit(&mut c);
            c.0
        })
    }

    /// Peak extra memory of saving this state, for an optimizer record of `optim_bytes` (the
    /// previous checkpoint's, or `None` before the first: two moments per parameter, AdamW).
    pub fn memory(&self, optim_bytes: Option<u64>) -> SaveMemory {
        save_memory(self.model_bytes(), optim_bytes)
    }

    /// Encodes every part on the calling thread (the blocking path; the same bytes as the
    /// producers of [`Self::into_snapshot`] write).
    pub fn encode(self) -> Result<EncodedState> {
        let slot = SchedulerSlot::default();
        let mut optim = Vec::new();
        encode_record(self.optim, &slot)
            .and_then(|bytes| write_canonical_optimizer(bytes, &mut optim))
            .map_err(|e| record_err(OPTIM_FILE, e))?;
        let scheduler = self
            .scheduler
            .into_record(&slot)
            .map_err(|e| record_err(SCHEDULER_FILE, e))?;
        Ok(EncodedState {
            step: self.trainer.step,
            epoch: self.trainer.epoch,
            optim,
            model: encode_model(self.model)?,
            scheduler: encode_scheduler(scheduler)?,
            trainer: self.trainer.to_bytes(),
        })
    }
}

/// The backend seed for `step`: a pure function of `(base_seed, step)`. Re-seed the device
/// with it before each step (`device.seed(step_seed(seed, step))`) so dropout is the same after
/// a resume.
pub fn step_seed(base_seed: u64, step: u64) -> u64 {
    mix_seed(&[base_seed, step, 0x5eed])
}

struct IdMapper {
    seed: u64,
    path: Vec<String>,
    count: u64,
}

impl IdMapper {
    fn next_id(&mut self) -> ParamId {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.path.join(".").bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.count += 1;
        // Keep ids in the JSON-safe integer range.
        ParamId::from(mix_seed(&[self.seed, h, self.count]) >> 12)
    }
}

impl ModuleMapper for IdMapper {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, mut param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        init_now(&param);
        param.id = self.next_id();
        param
    }
    fn map_int<const D: usize>(
        &mut self,
        mut param: Param<Tensor<D, Int>>,
    ) -> Param<Tensor<D, Int>> {
        init_now(&param);
        param.id = self.next_id();
        param
    }
    fn map_bool<const D: usize>(
        &mut self,
        mut param: Param<Tensor<D, Bool>>,
    ) -> Param<Tensor<D, Bool>> {
        init_now(&param);
        param.id = self.next_id();
        param
    }
}

/// Draws a lazily initialized parameter's value now. Burn 0.22 initializes a parameter at its
/// first use, from the backend RNG as it is then: after the caller seeded it, another thread
/// of the process may have re-seeded it or drawn from it.
/// (Dereferencing an initialized parameter only reads its cached value.)
fn init_now<T: burn::module::ParameterValue>(param: &Param<T>) {
    let _: &T = param;
}

/// Replaces every parameter's random [`ParamId`] with one derived from `(seed, path)`, so two
/// fresh runs with the same seed write byte-identical records (Burn draws ParamIds from an
/// unseedable RNG). Apply right after initializing the model, before any optimizer step.
///
/// Parameters Burn has not initialized yet (it initializes them lazily, at their first use)
/// are initialized here, so their values come from the backend RNG as the caller seeded it,
/// not as it is whenever the model is first used (the RNG is process-global: another thread
/// may re-seed it or draw from it in between).
pub fn assign_param_ids<M: Module>(module: M, seed: u64) -> M {
    module.map(&mut IdMapper {
        seed,
        path: Vec::new(),
        count: 0,
    })
}
