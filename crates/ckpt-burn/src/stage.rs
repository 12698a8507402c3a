//! The staging helper: one thread per training thread that takes the optimizer's record and
//! copies the model's tensors out after the save call returns, releasing each handle as soon
//! as it can, and hands the optimizer's part to the writer.

use std::time::Instant;

use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::optim::{ModuleOptimizer, OptimizerRecord};

use crate::encode::BoxError;
use crate::held::{SharedSlot, stage_slot};
use crate::pinned::Pin;

/// Failpoint (the `fail` crate, compiled in only where `fail/failpoints` is enabled) at the
/// start of a background save's staging helper: tests hold staging back with `sleep(ms)` so
/// that the persist reads handles the trainer has moved past.
pub const STAGE_FAILPOINT: &str = "ckpt_burn::stage";

/// A background save's staging, run on the calling thread's `ckpt-stage` helper once an engine
/// accepts the snapshot (or inline by the writer, where no thread can be started).
pub(crate) struct Staging {
    state: std::sync::Mutex<StageState>,
    /// Whether it was handed to a staging thread (once).
    queued: std::sync::atomic::AtomicBool,
    /// The job's [`StageJob::model_written`], opened when the writer asks for the record (it
    /// writes the model part first, but a wait must never outlast that request).
    model_written: Option<std::sync::Arc<ModelWritten>>,
}

/// What the helper is given: the model's slots, and the optimizer's handles with their pin or
/// its record already read and encoded inside the save call ([`crate::OptimizerRead`]).
pub(crate) struct StageJob {
    pub(crate) slots: Vec<SharedSlot>,
    pub(crate) optim: OptimState,
    /// Whether the model's parameters all live on one host-memory device (Flex), known at the
    /// capture: Burn's optimizer record is then an eager host copy.
    pub(crate) host: bool,
    /// Whether to stage the model's tensors, or leave them to the writer (which draws each from
    /// its handle as it writes it) for a save the trainer waits on.
    pub(crate) stage_model: bool,
    /// Where set, Burn's record is encoded only once the model part is written (or the writer
    /// asks for the record): see [`StageJob::run`].
    pub(crate) model_written: Option<std::sync::Arc<ModelWritten>>,
    /// Where a learner's scheduler record goes when its optimizer record is taken.
    pub(crate) scheduler: SchedulerSlot,
    /// Whether Burn's record of host-memory state goes to the writer as it is (written through
    /// a scratch file), instead of being encoded here.
    pub(crate) record_to_writer: bool,
}

/// Opens once a save's model part is written (or dropped unwritten), or once the writer asks
/// for the optimizer record, whichever comes first.
#[derive(Default)]
pub(crate) struct ModelWritten {
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
pub(crate) struct OpenWhenDropped(pub(crate) std::sync::Arc<ModelWritten>);

impl Drop for OpenWhenDropped {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// What a staging job produces: Burn's optimizer record, encoded.
pub(crate) type StageResult = std::result::Result<OptimOut, BoxError>;

/// The optimizer's part as the staging job hands it to the writer.
pub(crate) enum OptimOut {
    /// Burn's record, encoded (`into_bytes`).
    Encoded(burn::tensor::Bytes),
    /// Burn's record of host-memory state, for the writer to stream through a scratch file
    /// ([`write_record_through_file`]): no buffer of the whole record, no second copy.
    Record(OptimizerRecord),
}

/// A staging job not yet started, running on the staging thread (whose result arrives on the
/// receiver), or its result taken by the optimizer part.
pub(crate) enum StageState {
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
pub(crate) enum OptimState {
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
    fn records(&self) -> std::result::Result<SourceRecords, BoxError>;
}

/// The records an [`OptimizerSource`] gives: Burn's optimizer record, and the scheduler's
/// where the source holds the scheduler.
pub(crate) struct SourceRecords {
    pub(crate) optim: OptimizerRecord,
    pub(crate) scheduler: Option<LrSchedulerRecord>,
}

impl OptimizerSource for ModuleOptimizer {
    fn records(&self) -> std::result::Result<SourceRecords, BoxError> {
        Ok(SourceRecords {
            optim: self.to_record(),
            scheduler: None,
        })
    }
}

/// The scheduler record of a frozen learner, put here by whoever takes its optimizer record
/// (the staging helper, the save call, or the writer) and taken by the scheduler part, which
/// the engine writes after the optimizer part.
pub(crate) type SchedulerSlot = std::sync::Arc<std::sync::Mutex<Option<LrSchedulerRecord>>>;

/// Burn's record of `source`, with the scheduler's where it has one (into `scheduler`).
pub(crate) fn take_records(
    source: &dyn OptimizerSource,
    scheduler: &SchedulerSlot,
) -> std::result::Result<OptimizerRecord, BoxError> {
    let records = source.records()?;
    if let Some(sched) = records.scheduler {
        *scheduler.lock().unwrap_or_else(|e| e.into_inner()) = Some(sched);
    }
    Ok(records.optim)
}

/// Burn's record of `source`, encoded; `source` (its handles) is dropped only once the bytes
/// are read (see [`write_optimizer`]).
pub(crate) fn encode_record(
    source: Box<dyn OptimizerSource>,
    scheduler: &SchedulerSlot,
) -> std::result::Result<burn::tensor::Bytes, BoxError> {
    let bytes = take_records(source.as_ref(), scheduler)?.into_bytes()?;
    drop(source);
    Ok(bytes)
}

impl Staging {
    pub(crate) fn new(job: StageJob) -> Self {
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
    pub(crate) fn start(self: &std::sync::Arc<Self>) {
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
    pub(crate) fn bytes(&self) -> StageResult {
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
pub(crate) fn stage_on_helper(staging: std::sync::Arc<Staging>) {
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
pub(crate) fn start_stager() -> Option<std::sync::mpsc::Sender<std::sync::Arc<Staging>>> {
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
