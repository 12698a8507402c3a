//! Capture of Burn training state at one optimizer-step boundary.
//!
//! Burn tensors are reference-counted and copy-on-write: while a clone of a handle is alive,
//! the next update allocates a new buffer instead of writing in place. [`FrozenState::capture`]
//! therefore only clones the model, the [`ModuleOptimizer`] (handles), the scheduler record
//! (a few scalars) and the trainer state; that is the whole stall. The records are taken from
//! the clones and encoded to burnpack later, on the persist thread, by the part producers of
//! [`FrozenState::into_snapshot`], and still hold the step-k values (verified on Flex and on
//! the CubeCL path through wgpu). [`FrozenState::encode`] is the blocking path: the same bytes,
//! produced on the calling thread.
//!
//! Encoding streams ([`crate::pack::write_pack`]): the model's tensors are drawn one at a
//! time from handle clones and released once written, and the optimizer record (Burn's only
//! public view of optimizer state, which it materializes whole) is encoded once and streamed
//! out in the canonical name-sorted layout. No part is ever held as a second whole-file
//! buffer, so a save's memory is the held handles plus the optimizer record.

use std::{io::Write, path::PathBuf, time::Instant};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::lr_scheduler::{LrSchedulerRecord, module_lr_scheduler::ModuleLrScheduler};
use burn::optim::{ModuleOptimizer, OptimizerRecord};
use burn::tensor::{Bool, Int, Tensor};
use ckpt_core::{SaveMemory, Snapshot};

use crate::data::mix_seed;
use crate::pack::write_pack;
use crate::{Error, Result, TRAINER_FILE, TrainerState};

/// File name of the model record (burnpack, what `model.into_record().save(..)` writes).
pub const MODEL_FILE: &str = "model.bpk";
/// File name of the optimizer record (burnpack, loadable with `OptimizerRecord::load`).
pub const OPTIM_FILE: &str = "optim.bpk";
/// File name of the scheduler record (burnpack, loadable with `LrSchedulerRecord::load`).
pub const SCHEDULER_FILE: &str = "scheduler.bpk";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of training state that background saves still hold handle clones of (see
/// [`pinned_state_bytes`]).
static PINNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of training state (model tensors, optimizer state) that snapshots taken with
/// [`FrozenState::into_snapshot`] still hold handle clones of, in this process: not yet read
/// out by the persist thread. An optimizer update that runs while this is above zero copies
/// the tensors it touches instead of writing in place (host memory on Flex, device memory on
/// CubeCL backends). Sample it just before the update that follows a save to see how much of
/// the state that update had to copy.
pub fn pinned_state_bytes() -> u64 {
    PINNED.load(std::sync::atomic::Ordering::Relaxed)
}

/// A share of [`PINNED`], given back when dropped (read out, or the save dropped unread).
struct Pin(u64);

impl Pin {
    fn new(bytes: u64) -> Self {
        PINNED.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        Self(bytes)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        PINNED.fetch_sub(self.0, std::sync::atomic::Ordering::Relaxed);
    }
}

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

/// A tensor's bytes, taken once, when the writer draws it.
type Draw = Box<dyn FnOnce() -> burn::tensor::TensorData + Send>;

/// Collects a module's parameters as deferred burnpack tensors that hold handle clones, named
/// and ordered exactly as `Module::into_record` records them (module path, `on_save` form).
#[derive(Default)]
struct DeferredCollector {
    path: Vec<String>,
    tensors: Vec<burn_pack::Tensor>,
    /// Count each handle in [`PINNED`] until it is drawn.
    pin: bool,
}

impl DeferredCollector {
    fn push(&mut self, id: ParamId, dtype: burn::tensor::DType, shape: Vec<usize>, draw: Draw) {
        let name = self.path.join(".");
        let id = Some(id.val());
        let tensor = if matches!(dtype, burn::tensor::DType::QFloat(_)) {
            // Packed quantized data has no size formula: take it now.
            let (bytes, shape, dtype) = draw().into_parts();
            burn_pack::Tensor::new(name, dtype, shape, id, bytes)
        } else {
            let len = shape.iter().product::<usize>() * dtype.size();
            let pin = self.pin.then(|| Pin::new(len as u64));
            let slot = std::sync::Mutex::new(Some((draw, pin)));
            burn_pack::Tensor::deferred(name, dtype, shape, id, len, move || {
                let (draw, pin) = slot
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .ok_or_else(|| burn_pack::Error::IoError("tensor drawn twice".into()))?;
                let data = draw();
                drop(pin);
                Ok(data.into_bytes())
            })
        };
        self.tensors.push(tensor);
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
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(move || t.into_data()));
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        let t = param.transform_for_save().val();
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(move || t.into_data()));
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        let t = param.transform_for_save().val();
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(move || t.into_data()));
    }
}

/// Streams `model`'s record into `sink`: the bytes of `model.into_record().save(..)`, drawn
/// one tensor at a time. `model` is dropped first, so a tensor the trainer has since replaced
/// is held only here, read without a copy and freed once written.
pub(crate) fn write_model<M: Module>(
    model: M,
    sink: &mut dyn Write,
) -> std::result::Result<u64, BoxError> {
    write_model_counted(model, sink, false)
}

/// [`write_model`], counting each held tensor in [`pinned_state_bytes`] until it is drawn
/// when `pin` is set.
fn write_model_counted<M: Module>(
    model: M,
    sink: &mut dyn Write,
    pin: bool,
) -> std::result::Result<u64, BoxError> {
    let mut collector = DeferredCollector {
        pin,
        ..Default::default()
    };
    model.visit(&mut collector);
    drop(model);
    let none = std::collections::BTreeMap::new();
    Ok(write_pack(
        collector.tensors,
        &none,
        &std::collections::BTreeMap::new(),
        sink,
    )?)
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
    write_canonical_optimizer(encode_record(optim, None)?, sink)
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

/// The optimizer record's encoding, run on a helper thread from the moment the persist thread
/// starts on a save (or inline, where no thread can be started).
struct OptimEncoding(std::sync::Mutex<Encoding>);

enum Encoding {
    Waiting(ModuleOptimizer, Pin),
    Running(std::thread::JoinHandle<std::result::Result<burn::tensor::Bytes, BoxError>>),
    Taken,
}

/// Burn's record of `optim`, encoded; `optim` (its handles) is dropped only once the bytes are
/// read (see [`write_optimizer`]), and with it its share of [`pinned_state_bytes`].
fn encode_record(
    optim: ModuleOptimizer,
    pin: Option<Pin>,
) -> std::result::Result<burn::tensor::Bytes, BoxError> {
    let bytes = optim.to_record().into_bytes()?;
    drop(optim);
    drop(pin);
    Ok(bytes)
}

impl OptimEncoding {
    fn new(optim: ModuleOptimizer, pin: Pin) -> Self {
        Self(std::sync::Mutex::new(Encoding::Waiting(optim, pin)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Encoding> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the encoding on a helper thread (once; a later call does nothing).
    fn start(&self) {
        let mut state = self.lock();
        let (optim, pin) = match std::mem::replace(&mut *state, Encoding::Taken) {
            Encoding::Waiting(optim, pin) => (optim, pin),
            // Running or taken: put it back as it was.
            other => {
                *state = other;
                return;
            }
        };
        // The state travels by channel, so a failed spawn hands it back for the inline path.
        let (tx, rx) = std::sync::mpsc::channel::<(ModuleOptimizer, Pin)>();
        let spawned = std::thread::Builder::new()
            .name("ckpt-optim-encode".into())
            .spawn(move || match rx.recv() {
                Ok((optim, pin)) => encode_record(optim, Some(pin)),
                Err(_) => Err("the optimizer state never reached its encoder".into()),
            });
        *state = match spawned {
            Ok(handle) => match tx.send((optim, pin)) {
                Ok(()) => Encoding::Running(handle),
                Err(back) => Encoding::Waiting(back.0.0, back.0.1),
            },
            Err(e) => {
                tracing::debug!(error = %e, "no encoder thread: the optimizer record is encoded inline");
                Encoding::Waiting(optim, pin)
            }
        };
    }

    /// The encoded record: the helper thread's, or encoded now if it was never started.
    fn bytes(&self) -> std::result::Result<burn::tensor::Bytes, BoxError> {
        match std::mem::replace(&mut *self.lock(), Encoding::Taken) {
            Encoding::Waiting(optim, pin) => encode_record(optim, Some(pin)),
            Encoding::Running(handle) => handle
                .join()
                .map_err(|_| BoxError::from("the optimizer encoder panicked"))?,
            Encoding::Taken => Err("the optimizer record was taken twice".into()),
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
        // The persist thread writes the model while a helper encodes the optimizer record:
        // the model's tensors drawn so far, Burn's record of the moments (`to_record` copies
        // them out) and the buffer `into_bytes` encodes it into are held at once. Measured:
        // 1.67-1.74x the state with AdamW at 1-4 GB (docs/perf/DEFAULTS.md).
        background: model + 2 * optim,
        // While the trainer waits nothing is replaced, but the model's tensors are copied
        // out one at a time (they are shared with the live model) and the optimizer record
        // is materialized; the allocator keeps much of the freed copies, so count both.
        blocking: model + optim,
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
    optim: ModuleOptimizer,
    scheduler: LrSchedulerRecord,
    trainer: TrainerState,
    capture_time: std::time::Duration,
    /// [`FrozenState::model_bytes`], counted on first use (the trainer asks for it twice).
    model_bytes: std::cell::OnceCell<u64>,
}

impl<M> std::fmt::Debug for FrozenState<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrozenState")
            .field("trainer", &self.trainer)
            .field("capture_time", &self.capture_time)
            .finish()
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
        Self {
            model,
            optim,
            scheduler,
            trainer,
            capture_time: t0.elapsed(),
            model_bytes: std::cell::OnceCell::new(),
        }
    }

    /// The trainer state captured.
    pub fn trainer(&self) -> &TrainerState {
        &self.trainer
    }

    /// Time [`Self::capture`] took on the calling thread.
    pub fn capture_time(&self) -> std::time::Duration {
        self.capture_time
    }

    /// A snapshot whose model and optimizer parts are encoded later, on the persist thread,
    /// from the frozen clones. The capture time is recorded as the snapshot's stall. The parts
    /// declare what they hold ([`Snapshot::holding`]) for an optimizer record of the AdamW
    /// size; see [`Self::into_snapshot_sized`].
    pub fn into_snapshot(self) -> Snapshot {
        self.into_snapshot_sized(None)
    }

    /// [`Self::into_snapshot`] for an optimizer record of `optim_bytes` (the previous
    /// checkpoint's; `None`: two moments per parameter). The model part holds the model's
    /// bytes until written (training copies every updated tensor still held); the optimizer
    /// part holds twice the record until written (Burn's `to_record` copies the moments out
    /// and its `into_bytes` encodes them into one more buffer: the public API has no streaming
    /// path).
    pub fn into_snapshot_sized(self, optim_bytes: Option<u64>) -> Snapshot {
        let model_bytes = self.model_bytes();
        let optim_bytes = optim_bytes.unwrap_or(2 * model_bytes);
        let Self {
            model,
            optim,
            scheduler,
            trainer,
            capture_time,
            ..
        } = self;
        let t0 = Instant::now();
        // The model part is written first and starts the optimizer's encoding on a helper
        // thread, so the disk writes the model while Burn's record is read into one buffer.
        // Both finish long before the next optimizer update on a save the persist thread takes
        // at once: the model's and the moments' handles are released in time, nothing is
        // copied on write, and only the record's buffer is held until written.
        let model_pin = Pin::new(model_bytes);
        let encoding = std::sync::Arc::new(OptimEncoding::new(optim, Pin::new(optim_bytes)));
        let starter = encoding.clone();
        let model_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            starter.start();
            // From here each tensor is counted until it is drawn.
            drop(model_pin);
            write_model_counted(model, sink, true).map(drop)
        };
        let optim_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            write_canonical_optimizer(encoding.bytes()?, sink).map(drop)
        };
        let sched_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            let bytes = scheduler.into_bytes()?;
            sink.write_all(&bytes)?;
            Ok(())
        };
        let snap = Snapshot::new(trainer.step)
            .with_epoch(trainer.epoch)
            .with_producer(MODEL_FILE, model_part)
            .holding(model_bytes)
            .with_producer(OPTIM_FILE, optim_part)
            .holding(2 * optim_bytes)
            .with_producer(SCHEDULER_FILE, sched_part)
            .with_bytes(TRAINER_FILE, trainer.to_bytes());
        snap.with_capture_time(capture_time + t0.elapsed())
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
        Ok(EncodedState {
            step: self.trainer.step,
            epoch: self.trainer.epoch,
            optim: encode_optimizer(&self.optim)?,
            model: encode_model(self.model)?,
            scheduler: encode_scheduler(self.scheduler)?,
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
        param.id = self.next_id();
        param
    }
    fn map_int<const D: usize>(
        &mut self,
        mut param: Param<Tensor<D, Int>>,
    ) -> Param<Tensor<D, Int>> {
        param.id = self.next_id();
        param
    }
    fn map_bool<const D: usize>(
        &mut self,
        mut param: Param<Tensor<D, Bool>>,
    ) -> Param<Tensor<D, Bool>> {
        param.id = self.next_id();
        param
    }
}

/// Replaces every parameter's random [`ParamId`] with one derived from `(seed, path)`, so two
/// fresh runs with the same seed write byte-identical records (Burn draws ParamIds from an
/// unseedable RNG). Apply right after initializing the model, before any optimizer step.
pub fn assign_param_ids<M: Module>(module: M, seed: u64) -> M {
    module.map(&mut IdMapper {
        seed,
        path: Vec::new(),
        count: 0,
    })
}
