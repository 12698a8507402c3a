//! The optimizer and scheduler records of a Burn [`Learner`], taken off the training thread.
//!
//! Burn 0.22.1's `Learner` keeps its optimizer and LR scheduler private: the only public code
//! that reads them is `LearningCheckpointer::checkpoint(&learner, ..)`, which builds the three
//! records on the calling thread (`optim.to_record()` copies every optimizer moment). But
//! `Learner` is `Clone`, and a clone is handle clones (copy-on-write tensors, value-type
//! scheduler state): a clone taken at a step boundary keeps that step's state however far
//! training goes on. [`LearnerTap`] owns a `LearningCheckpointer` of its own whose
//! checkpointers only catch the records it hands them, so the records of such a clone can be
//! taken later, on a staging thread: the training thread pays for the clone only.
//!
//! Ruled out, read in burn-train 0.22.1: `Learner`'s fields are private and it has no
//! accessor for the optimizer or scheduler (`load_optim`/`load_scheduler` only write);
//! `LearningCheckpointer` is the one public reader, and `LearningCheckpointer::new` and
//! `AsyncCheckpointer::new` are public, so a strategy needs no checkpointer from the user.
//! That call also builds the model's record (`model.clone().into_record()`, a copy of the
//! model's tensors) before it copies the optimizer's state. A save writes the model part from
//! the frozen model's own handles (as the trainer's saves do, without a copy), so the tap drops
//! that record as Burn hands it over, on Burn's checkpointer thread, while Burn's call goes on:
//! the two copies are never in memory together. Only [`HeldLearner::take`] (a ZeRO rank's
//! checkpoint thread, which writes the model from Burn's record) keeps it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::optim::OptimizerRecord;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::store::ModuleRecord;
use burn::train::checkpoint::{AsyncCheckpointer, Checkpoint, Checkpointer, CheckpointerError};
use burn::train::metric::store::EventStoreClient;
use burn::train::{Learner, LearnerModel, LearningCheckpointer};

use crate::checkpointers::AlwaysSave;
use crate::pinned::Pin;
use crate::stage::{OptimizerSource, SourceRecords};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Longest wait for Burn's checkpointer threads to hand over a learner's records.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(600);

/// A checkpointer that hands the record Burn gives it to the tap, or, where `keep` says not,
/// drops it at once on Burn's checkpointer thread (while Burn's call goes on to the next
/// record) and hands over `None`.
struct Catch<R> {
    tx: SyncSender<Option<R>>,
    keep: Arc<AtomicBool>,
}

impl<R> Catch<R> {
    /// A catcher whose record is kept while `keep` is set.
    fn new(tx: SyncSender<Option<R>>, keep: &Arc<AtomicBool>) -> Self {
        Self {
            tx,
            keep: keep.clone(),
        }
    }
}

impl<R: Checkpoint> Checkpointer<R> for Catch<R> {
    fn save(&self, _key: usize, record: R) -> Result<(), CheckpointerError> {
        let record = self.keep.load(Ordering::Acquire).then_some(record);
        self.tx
            .send(record)
            .map_err(|_| CheckpointerError::Unknown("the record tap is gone".into()))
    }
    fn delete(&self, _key: usize) -> Result<(), CheckpointerError> {
        Ok(())
    }
    fn restore(&self, _key: usize) -> Result<R, CheckpointerError> {
        Err(CheckpointerError::Unknown(
            "the record tap restores nothing".into(),
        ))
    }
}

/// Burn's checkpointer with the receiving ends of its three catchers, driven one call at a
/// time.
struct Tap<M: LearnerModel> {
    checkpointer: LearningCheckpointer<M>,
    model: Receiver<Option<ModuleRecord>>,
    /// Whether the model's catcher passes the record on (set for each call).
    keep_model: Arc<AtomicBool>,
    optim: Receiver<Option<OptimizerRecord>>,
    scheduler: Receiver<Option<LrSchedulerRecord>>,
}

struct TapInner<M: LearnerModel> {
    tap: Mutex<Tap<M>>,
    /// The event store its strategy is given (ours, [`AlwaysSave`], reads nothing of it).
    store: Arc<EventStoreClient>,
}

/// Takes the optimizer and scheduler records of a [`Learner`] (see the module docs). Cheap to
/// clone; Burn's three checkpointer threads end when the last clone is dropped.
pub struct LearnerTap<M: LearnerModel> {
    inner: Arc<TapInner<M>>,
}

impl<M: LearnerModel> Clone for LearnerTap<M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<M: LearnerModel> std::fmt::Debug for LearnerTap<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnerTap").finish_non_exhaustive()
    }
}

/// The record `rx` receives within [`HANDOVER_TIMEOUT`] (`None`: its catcher dropped it).
fn handed<T>(rx: &Receiver<Option<T>>, what: &str) -> Result<Option<T>, BoxError> {
    rx.recv_timeout(HANDOVER_TIMEOUT).map_err(|e| {
        format!("Burn's checkpointer did not hand over the learner's {what} record: {e}").into()
    })
}

/// [`handed`], from a catcher that keeps its record.
fn kept<T>(rx: &Receiver<Option<T>>, what: &str) -> Result<T, BoxError> {
    handed(rx, what)?.ok_or_else(|| format!("the tap dropped the learner's {what} record").into())
}

impl<M: LearnerModel> LearnerTap<M> {
    /// A tap handing `store` to Burn's checkpointer (which only passes it to its strategy).
    pub fn new(store: Arc<EventStoreClient>) -> Self {
        let (mtx, model) = sync_channel(1);
        let (otx, optim) = sync_channel(1);
        let (stx, scheduler) = sync_channel(1);
        let keep_model = Arc::new(AtomicBool::new(false));
        let always = Arc::new(AtomicBool::new(true));
        let checkpointer = LearningCheckpointer::new(
            AsyncCheckpointer::new(Catch::new(mtx, &keep_model)),
            AsyncCheckpointer::new(Catch::new(otx, &always)),
            AsyncCheckpointer::new(Catch::new(stx, &always)),
            Box::new(AlwaysSave),
        );
        Self {
            inner: Arc::new(TapInner {
                tap: Mutex::new(Tap {
                    checkpointer,
                    model,
                    keep_model,
                    optim,
                    scheduler,
                }),
                store,
            }),
        }
    }

    /// The optimizer and scheduler records of `learner`, built now on the calling thread.
    pub fn records(
        &self,
        learner: &Learner<M>,
    ) -> Result<(OptimizerRecord, LrSchedulerRecord), BoxError> {
        let (optim, scheduler, _) = self.all_records(learner, false)?;
        Ok((optim, scheduler))
    }

    /// The optimizer, scheduler and (where `keep_model`) model records of `learner`, built now
    /// on the calling thread. Burn's call copies the model's tensors whatever the caller wants:
    /// unkept, that copy is freed as soon as Burn hands it over, before the optimizer's copy.
    pub(crate) fn all_records(
        &self,
        learner: &Learner<M>,
        keep_model: bool,
    ) -> Result<(OptimizerRecord, LrSchedulerRecord, Option<ModuleRecord>), BoxError> {
        let mut tap = self.inner.tap.lock().unwrap_or_else(|e| e.into_inner());
        tap.keep_model.store(keep_model, Ordering::Release);
        tap.checkpointer.checkpoint(learner, 0, &self.inner.store);
        let model = handed(&tap.model, "model")?;
        let optim = kept(&tap.optim, "optimizer")?;
        let scheduler = kept(&tap.scheduler, "scheduler")?;
        Ok((optim, scheduler, model))
    }
}

/// Burn's three records of a learner, as [`HeldLearner::take`] hands them over.
pub struct LearnerRecords {
    /// The model's record: what `model.into_record()` gives, `model.bpk`'s bytes when saved.
    pub model: ModuleRecord,
    /// The optimizer's record (on a ZeRO rank: its shard).
    pub optim: OptimizerRecord,
    /// The LR scheduler's record.
    pub scheduler: LrSchedulerRecord,
    /// The model's bytes (its parameters' data), as counted when the learner was frozen.
    pub model_bytes: u64,
    /// The optimizer state's bytes the learner was frozen with ([`HeldLearner::freeze`]'s
    /// estimate).
    pub optim_bytes: u64,
    /// Whether the records' data are host memory (Flex), copies that may be kept past
    /// [`HeldLearner::take`]; else (a device backend) they are lazy reads of the learner's
    /// buffers, to be read inside it.
    pub host_memory: bool,
}

/// A learner frozen at a step boundary for a save whose records are taken on another thread
/// (a ZeRO rank's checkpoint thread, say): a clone, handle clones only, so the training thread
/// pays for no copy. Until it is given back, an optimizer update cannot write the state it
/// holds in place and copies it instead; it is counted in [`crate::pinned_state_bytes`], so
/// the update that follows a save can wait for it ([`crate::wait_pinned_at_most`], where
/// [`crate::UpdateWait`] says so).
pub struct HeldLearner<M: LearnerModel> {
    learner: Learner<M>,
    tap: LearnerTap<M>,
    model_bytes: u64,
    optim_bytes: u64,
    _pin: Pin,
}

impl<M: LearnerModel> std::fmt::Debug for HeldLearner<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLearner").finish_non_exhaustive()
    }
}

impl<M: LearnerModel> HeldLearner<M> {
    /// Freezes `learner` (a clone), to be read through `tap`. It counts as the model's bytes
    /// plus `optim_bytes` (the optimizer state it holds, an estimate: it sizes
    /// [`crate::pinned_state_bytes`] only) until given back.
    pub fn freeze(learner: &Learner<M>, tap: &LearnerTap<M>, optim_bytes: u64) -> Self {
        let learner = learner.clone();
        let model_bytes = crate::capture::module_bytes(&learner.model());
        Self {
            learner,
            tap: tap.clone(),
            model_bytes,
            optim_bytes,
            _pin: Pin::new(model_bytes + optim_bytes),
        }
    }

    /// Takes Burn's records of the frozen learner on the calling thread, gives the learner
    /// back as early as the records allow, and returns what `read` makes of them.
    ///
    /// On host memory (Flex) Burn's records are copies: the learner is given back before
    /// `read` runs, so an update waiting for it goes on while `read` works. On a device backend
    /// (CubeCL) a record's data are lazy reads of the learner's buffers: the learner is given
    /// back only after `read`, which must read to host memory every record's data it keeps.
    pub fn take<R>(
        self,
        read: impl FnOnce(LearnerRecords) -> Result<R, BoxError>,
    ) -> Result<R, BoxError> {
        let host = crate::submit::first_device(&self.learner.model())
            .is_some_and(|d| !crate::pinned::holds_device_memory(&d));
        let (optim, scheduler, model) = self.tap.all_records(&self.learner, true)?;
        let model = model.ok_or("the tap dropped the learner's model record")?;
        let records = LearnerRecords {
            model,
            optim,
            scheduler,
            model_bytes: self.model_bytes,
            optim_bytes: self.optim_bytes,
            host_memory: host,
        };
        if host {
            drop(self);
            read(records)
        } else {
            let out = read(records);
            drop(self);
            out
        }
    }
}

/// A learner frozen at a step boundary (a clone: handle clones) with the tap that reads it.
pub(crate) struct FrozenLearner<M: LearnerModel> {
    pub(crate) learner: Learner<M>,
    pub(crate) tap: LearnerTap<M>,
}

impl<M: LearnerModel> OptimizerSource for FrozenLearner<M> {
    fn records(&self) -> Result<SourceRecords, BoxError> {
        // The model part is written from the frozen model's handles, not from this record.
        let (optim, scheduler, _) = self.tap.all_records(&self.learner, false)?;
        Ok(SourceRecords {
            optim,
            scheduler: Some(scheduler),
        })
    }
}
