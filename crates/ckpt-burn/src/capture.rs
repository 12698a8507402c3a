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
//! host memory (Flex), Burn's optimizer record is taken (an eager copy, two thirds of the
//! state with AdamW) and the optimizer's handles are dropped as soon as it is; the model's
//! handles are *held* for the writer, which reads each tensor as it writes it: an update
//! before that allocates a fresh buffer instead of writing in place (copy-on-write), and the
//! writer then owns the old one, so the model costs no copy at all (copying it out instead,
//! [`ModelStaging::Stage`], lost no less training time and took more memory when measured:
//! `docs/perf/HISTORY.md`, session 25).
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
//! [`FrozenState::submit`] sets), the writer streams it out through a scratch file
//! ([`crate::scratch`]: in RAM where `/dev/shm` has room, else in the root;
//! `OptimizerRecord::save`, tensor by tensor, each freed once written), then into the part in
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

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::{LrSchedulerRecord, module_lr_scheduler::ModuleLrScheduler};
use burn::tensor::{Bool, Int, Tensor};
use ckpt_core::{Snapshot, session::SaveMemory};

use crate::encode::{
    BoxError, MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, encode_model, encode_scheduler, record_err,
    write_canonical_optimizer, write_record_through_file,
};
use crate::held::{SharedSlot, collect_model, read_model_eagerly, write_entries};
use crate::pinned::Pin;
use crate::stage::{
    ModelWritten, OpenWhenDropped, OptimOut, OptimState, OptimizerSource, SchedulerSlot, StageJob,
    Staging, encode_record,
};
use crate::{Result, TRAINER_FILE, TrainerState};

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

/// Bytes of `module`'s parameters (shapes times dtype sizes; no data is read).
pub(crate) fn module_bytes<M: Module>(module: &M) -> u64 {
    let mut c = SizeCounter(0);
    module.visit(&mut c);
    c.0
}

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

/// How a background save takes the model's tensors off host-memory state (see the module
/// docs; [`FrozenState::with_model_staging`]); device memory is always staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelStaging {
    /// Copy each tensor out on the staging helper at once and release its handle.
    Stage,
    /// Keep the handles; the writer reads each tensor as it writes it (the default).
    #[default]
    Hold,
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
    /// Whether a background snapshot of host-memory state that training does not wait for
    /// holds the model (the default) or stages it.
    model_staging: ModelStaging,
    /// The checkpoint root, where the writer puts a scratch file when RAM has no room for it
    /// ([`crate::scratch`]).
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
            model_staging: ModelStaging::Hold,
            scratch_dir: None,
        }
    }

    /// Lets a background snapshot of host-memory state write Burn's optimizer record through
    /// a scratch file: in RAM (`/dev/shm`) where that has room, else in `dir` (the engine's
    /// root, where start-up recovery removes a `.tmp-*` file a crash left); see
    /// `docs/design.md`, "Scratch files". Burn's public
    /// `OptimizerRecord::save` streams the record out tensor by tensor, each freed as written,
    /// where `into_bytes` would hold it twice more for a moment (one buffer of the whole
    /// record, and in cubecl-environment 0.11.3 a realigned copy of it). The writer then
    /// streams the file into the part in the canonical layout and removes it. Costs one more
    /// write and read of the record through memory (and, in the root, Burn's sync of that file
    /// to disk).
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
        // The clone holds the model's handles too, until its records are taken. Burn's call
        // that takes them copies the model as well; that copy is dropped as it is handed over
        // (the model part is written from the frozen model, as the trainer's is).
        state.source_extra = state.model_bytes();
        state.capture_time = t0.elapsed();
        state
    }

    /// Sets how a background snapshot takes the model's tensors off the training state where
    /// they are host memory (Flex; default [`ModelStaging::Hold`]): held for the writer, which
    /// reads each as it writes it (an update in between copies it on write, and the writer
    /// then reads the old buffer without a copy), or copied out at once by the staging helper.
    /// Either way the snapshot keeps the captured step's values. On a device backend the
    /// model is always staged: held handles would keep device memory.
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
    /// memory, the trainer does not wait (`None`) and [`Self::with_model_staging`] says to
    /// hold it (the default). The optimizer record is taken
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
        // A held model (host memory, Hold, training going on at once) is written from its
        // handles; otherwise it is staged (what a throttled save has not written when the
        // trainer resumes), unless the trainer already waited for it.
        let held = host && model_staging == ModelStaging::Hold && wait_limit.is_none();
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
        let step = trainer.step;
        let model_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            starter.start();
            let written = write_entries(entries, sink);
            drop(written_mark);
            written.map(drop)
        };
        let optim_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            match staging.bytes()? {
                OptimOut::Encoded(bytes) => write_canonical_optimizer(bytes, sink).map(drop),
                OptimOut::Record(record) => match &scratch_dir {
                    Some(dir) => {
                        write_record_through_file(record, optim_bytes, dir, step, sink).map(drop)
                    }
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
        *self.model_bytes.get_or_init(|| module_bytes(&self.model))
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
