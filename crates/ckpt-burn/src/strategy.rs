//! Step-level checkpointing inside Burn's learner: a [`SupervisedLearningStrategy`]
//! (`TrainingStrategy::Custom`) that runs the single-device loop of burn-train 0.22.1 and
//! checkpoints at optimizer-step boundaries, as a [`CheckpointSession`] decides.
//!
//! A save does not stall training: at the step boundary the strategy clones the learner
//! (handle clones, copy-on-write) and submits it ([`crate::FrozenState::capture_learner`]);
//! Burn's records of the optimizer and scheduler are taken from that clone on the staging
//! helper ([`crate::LearnerTap`]: Burn keeps the learner's optimizer private, and its own
//! `LearningCheckpointer` is the one public reader), the model is staged from its handles, and
//! everything is encoded and written on the engine's persist thread, under the same snapshot
//! budget and staging rules as any other loop of this crate. The next optimizer update waits
//! until those records are taken (they are taken beside its forward and backward passes), so
//! it writes in place instead of copying the whole learner ([`crate::UpdateWait::Auto`]). Checkpoints go to
//! `step-<step:08>` directories of the [`CkptCheckpointers`] root with a `trainer.bin`
//! ([`crate::TrainerState`]: the step, the epoch (0-based) and the batches of it done as the
//! cursor's position, the [`CkptTrainingStrategy::deterministic`] seed or 0; the cursor's
//! shuffle seed is 0, as Burn's loaders do not expose theirs) and the manifest entries
//! `burn_epoch_iteration` and `burn_epoch_complete`, which resume reads back. The strategy
//! needs no checkpointers registered with Burn (`with_custom_checkpointers` is only for
//! Burn's epoch route, [`crate::checkpointers`]).
//!
//! The example is on [`CkptTrainingStrategy`].
//!
//! Limits (what Burn's public API allows):
//! - Single device only (Burn's multi-device and DDP loops are `pub(crate)`).
//! - Burn's `LearningCheckpointer` also builds the model's record (a copy of the model's
//!   tensors) when the records are taken: CPU work for nothing. The tap drops it as Burn hands
//!   it over, before Burn copies the optimizer's state, and the model part is written from the
//!   frozen model's handles.
//! - Resume restores model, optimizer and scheduler exactly (Burn's `.checkpoint(step)`, which
//!   the strategy restores itself when no checkpointers are registered with Burn, or
//!   [`CkptTrainingStrategy::resume_latest`]). Burn's shuffled `DataLoaderBuilder` loaders
//!   draw a new order at every `iter()` from an RNG that starts afresh in each process, so the
//!   strategy replays one `iter()` per earlier epoch, then skips the batches of the interrupted
//!   epoch that were already trained by drawing and discarding them (`DataLoader::slice` would
//!   not give the same items: it slices before shuffling). That reproduces the order of
//!   `batch_size(..).shuffle(seed)` loaders with no workers or `num_workers(1)`; with more
//!   workers Burn interleaves their batches in arrival order, which no resume can replay (the
//!   loader trait does not expose its worker count, so this cannot be checked: use one worker
//!   for exact resume). Dropout replays with [`CkptTrainingStrategy::deterministic`]. Metric
//!   state is not restored.
//! - Gradient accumulation is supported as in Burn; the step count is in optimizer steps.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::optim::GradientsAccumulator;
use burn::tensor::Device;
use burn::train::checkpoint::CheckpointerError;
use burn::train::{
    EventProcessorTraining, InferenceStep, Interrupter, Learner, LearnerEvent, LearnerModel,
    LearningResult, SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader,
    TrainingComponents, TrainingItem, TrainingStrategy, ValidLoader,
};
use ckpt_core::{CheckpointSession, FrequencyPolicy, SessionConfig, layout::checkpoint_dir_name};

use crate::checkpointers::{CkptCheckpointers, Collector};
use crate::{FrozenState, LearnerTap, OptimizerRead, SaveTuning, UpdateWaits};

/// Manifest entry: training iterations of the epoch done at the checkpoint.
pub const META_EPOCH_ITERATION: &str = "burn_epoch_iteration";
/// Manifest entry: whether the epoch (training and validation) was complete.
pub const META_EPOCH_COMPLETE: &str = "burn_epoch_complete";

/// Where a run resumes: read from the manifest of the checkpoint Burn restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePoint {
    /// Global optimizer steps done.
    pub step: u64,
    /// Epoch (1-based, Burn's numbering) to run first.
    pub epoch: usize,
    /// Training iterations of that epoch to skip.
    pub skip: usize,
}

/// Single-device training loop with step-level checkpoints. See the module docs.
///
/// ```no_run
/// # use burn::train::{Learner, SupervisedTraining, LearnerModel};
/// # use burn::tensor::Device;
/// # fn demo<M: LearnerModel>(training: SupervisedTraining<M>, learner: Learner<M>, device: Device)
/// # -> Result<(), ckpt_burn::Error> {
/// use ckpt_burn::checkpointers::CkptCheckpointers;
/// use ckpt_burn::strategy::CkptTrainingStrategy;
/// use ckpt_core::{EngineConfig, FrequencyPolicy};
///
/// let ckpt = CkptCheckpointers::open(EngineConfig::new("runs/demo/ckpt"))?;
/// let strategy = CkptTrainingStrategy::new(device, &ckpt, FrequencyPolicy::EverySteps(100));
/// let result = training
///     .with_training_strategy(strategy.resume_latest().into_training_strategy())
///     .launch(learner);
/// ckpt.finish()?;
/// # Ok(()) }
/// ```
pub struct CkptTrainingStrategy {
    device: Device,
    collector: Arc<Collector>,
    policy: FrequencyPolicy,
    save_at_epoch_end: bool,
    save_on_stop: bool,
    resume_latest: bool,
    deterministic: Option<u64>,
    tuning: SaveTuning,
    /// Computed by `train`, taken by `fit` (avoids verifying the checkpoint twice).
    resume: Mutex<Option<ResumePoint>>,
}

impl std::fmt::Debug for CkptTrainingStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CkptTrainingStrategy")
            .field("device", &self.device)
            .field("save_at_epoch_end", &self.save_at_epoch_end)
            .finish()
    }
}

impl CkptTrainingStrategy {
    /// A strategy training on `device` (made autodiff if it is not) and checkpointing into
    /// `ckpt`'s root per `policy` (no checkpointers need to be registered with Burn).
    /// By default it also checkpoints at the end of every epoch (after validation) and when
    /// training is stopped through the interrupter.
    pub fn new(device: Device, ckpt: &CkptCheckpointers, policy: FrequencyPolicy) -> Self {
        let device = if device.is_autodiff() {
            device
        } else {
            device.autodiff()
        };
        Self {
            device,
            collector: ckpt.collector().clone(),
            policy,
            save_at_epoch_end: true,
            save_on_stop: true,
            resume_latest: false,
            deterministic: None,
            tuning: SaveTuning::default(),
            resume: Mutex::new(None),
        }
    }

    /// Whether to checkpoint at the end of every epoch too (default: yes).
    pub fn save_at_epoch_end(mut self, yes: bool) -> Self {
        self.save_at_epoch_end = yes;
        self
    }

    /// Whether to checkpoint when training is stopped through the interrupter (default: yes).
    pub fn save_on_stop(mut self, yes: bool) -> Self {
        self.save_on_stop = yes;
        self
    }

    /// Resume from the newest valid checkpoint in the root, if there is one, with no step
    /// for the user to find: the strategy restores model, optimizer and scheduler into the
    /// learner itself (start-up recovery already fell back past invalid checkpoints, each a
    /// warning) and continues at the step and position it records. An empty root is a fresh
    /// start. A `.checkpoint(n)` given to Burn takes precedence.
    pub fn resume_latest(mut self) -> Self {
        self.resume_latest = true;
        self
    }

    /// Deterministic mode, for exact resume of models that draw from the backend RNG
    /// (dropout): before every training item the backend RNG is re-seeded from `(seed, step,
    /// item within the step)`, so a resumed run draws exactly the masks the uninterrupted one
    /// drew. Compared with a plain Burn run, the masks are different (Burn seeds once, at
    /// start) but equally random, and the RNG is re-seeded for everything else on the
    /// training thread too (model initialization is done before training, so it is not
    /// affected). Burn's backend RNG is process-global: seeding and the forward/backward pass
    /// hold [`crate::backend_rng_lock`], and any other thread of the process that draws from
    /// the backend RNG during training must hold it too, or the replay breaks.
    pub fn deterministic(mut self, seed: u64) -> Self {
        self.deterministic = Some(seed);
        self
    }

    /// How background saves trade memory against training time ([`SaveTuning`]; every
    /// setting `auto` by default, as for [`crate::CheckpointManager`]).
    pub fn tuning(mut self, tuning: SaveTuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Re-emits what start-up recovery did when the checkpoints were opened (before Burn's
    /// logger existed), so it reaches Burn's log too.
    fn report_recovery(&self) {
        let r = self.collector.recovery();
        for p in &r.removed_tmp {
            tracing::warn!(path = %p.display(), "recovery removed unfinished checkpoint data of an earlier run (never published)");
        }
        for (p, reason) in &r.quarantined {
            tracing::warn!(checkpoint = %p.display(), %reason, "recovery moved an invalid checkpoint aside and fell back to an older one");
        }
        if r.repaired_latest {
            tracing::warn!(latest = ?r.latest.as_ref().map(|c| c.step), "recovery repaired the `latest` pointer");
        }
    }

    /// Restores the newest valid checkpoint into `learner`; its step, or `None` for an empty
    /// root.
    fn restore_latest<M: LearnerModel>(
        &self,
        learner: &mut Learner<M>,
    ) -> Result<Option<usize>, CheckpointerError> {
        let Some(step) = self.collector.latest_step() else {
            tracing::info!(root = %self.collector.root().display(), "no checkpoint to resume: a fresh run");
            return Ok(None);
        };
        self.restore_step(learner, step as usize)?;
        tracing::info!(step, root = %self.collector.root().display(), "resumed from the newest valid checkpoint");
        Ok(Some(step as usize))
    }

    /// Restores checkpoint `key` (a step) into `learner`.
    fn restore_step<M: LearnerModel>(
        &self,
        learner: &mut Learner<M>,
        key: usize,
    ) -> Result<(), CheckpointerError> {
        use burn::train::checkpoint::Checkpointer;
        let c = self.collector.clone();
        learner.load_model(crate::checkpointers::ModelCheckpointer::new(c.clone()).restore(key)?);
        learner.load_optim(crate::checkpointers::OptimCheckpointer::new(c.clone()).restore(key)?);
        learner.load_scheduler(crate::checkpointers::SchedulerCheckpointer::new(c).restore(key)?);
        Ok(())
    }

    /// For `SupervisedTraining::with_training_strategy`.
    pub fn into_training_strategy<M: LearnerModel>(self) -> TrainingStrategy<M> {
        TrainingStrategy::Custom(Arc::new(self))
    }

    /// The resume point for checkpoint `step` (Burn's `.checkpoint(step)`).
    pub fn resume_point(&self, step: usize) -> crate::Result<ResumePoint> {
        let dir = self.collector.root().join(checkpoint_dir_name(step as u64));
        let manifest = ckpt_core::verify_checkpoint(&dir)?;
        let epoch = manifest.epoch.max(1) as usize;
        let bad = |key: &str, v: &serde_json::Value| {
            crate::Error::Config(format!(
                "cannot resume from {}: manifest entry {key} is {v}, not what this strategy \
                 writes",
                dir.display()
            ))
        };
        // Without the entries (an epoch-keyed checkpoint) the epoch was complete.
        let iteration = match manifest.meta.get(META_EPOCH_ITERATION) {
            None => 0,
            Some(v) => v.as_u64().ok_or_else(|| bad(META_EPOCH_ITERATION, v))? as usize,
        };
        let complete = match manifest.meta.get(META_EPOCH_COMPLETE) {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| bad(META_EPOCH_COMPLETE, v))?,
        };
        Ok(if complete {
            ResumePoint {
                step: manifest.step,
                epoch: epoch + 1,
                skip: 0,
            }
        } else {
            ResumePoint {
                step: manifest.step,
                epoch,
                skip: iteration,
            }
        })
    }
}

struct Run<'a, M: LearnerModel> {
    /// Reads the optimizer's and scheduler's records of a frozen learner.
    tap: LearnerTap<M>,
    interrupter: Interrupter,
    collector: &'a Collector,
    session: CheckpointSession,
    step: u64,
    /// The deterministic-mode seed recorded in `trainer.bin` (0 without).
    seed: u64,
    /// When a save on a device backend reads the optimizer's state.
    optimizer_read: OptimizerRead,
    /// The updates' waits for the saves, counted in their stalls.
    waits: UpdateWaits,
}

impl<M: LearnerModel> Run<'_, M> {
    /// Records published saves (each an info line, which reaches Burn's `experiment.log`); a
    /// background error fails training.
    fn poll(&mut self) {
        let mut target = self.collector;
        let before = self.session.report().saves.len();
        if let Err(e) = self.session.poll(&mut target) {
            self.interrupter
                .fail(CheckpointerError::Unknown(e.to_string()));
        }
        for s in &self.session.report().saves[before..] {
            // Its records are taken before it is published, so an update that waited for
            // them has waited by now.
            let wait_ms = self.waits.of(s.step).as_secs_f64() * 1e3;
            tracing::info!(
                step = s.step,
                stall_ms = s.stall_ms + wait_ms,
                update_wait_ms = wait_ms,
                persist_ms = s.persist_ms.unwrap_or(f64::NAN),
                mb = s.bytes as f64 / 1e6,
                "checkpoint published"
            );
        }
    }

    /// At the end of training: what the saves published so far cost (an info line; a stall
    /// counts the updates' wait for its save).
    fn summarize(&self) {
        let r = self.session.report();
        let waited = |step| self.waits.of(step).as_secs_f64() * 1e3;
        let mut stalls: Vec<f64> = r
            .saves
            .iter()
            .map(|s| s.stall_ms + waited(s.step))
            .collect();
        stalls.sort_by(f64::total_cmp);
        tracing::info!(
            published = r.saves.len(),
            median_stall_ms = stalls.get(stalls.len() / 2).copied().unwrap_or(0.0),
            max_stall_ms = stalls.last().copied().unwrap_or(0.0),
            throttled = r.throttled_saves.len(),
            blocking = r.blocking_saves.len(),
            "checkpoints of this run so far (CkptCheckpointers::finish waits for the rest)"
        );
    }

    /// Freezes the learner at this step (handle clones) and submits it as a background save:
    /// its records are taken and encoded off the training thread, with the epoch and the
    /// position in it for resume.
    fn checkpoint(&mut self, learner: &Learner<M>, epoch: usize, iteration: usize, done: bool) {
        if !self.session.should_force(self.step) {
            return;
        }
        let (step, collector, seed, read) =
            (self.step, self.collector, self.seed, self.optimizer_read);
        let tap = &self.tap;
        let mut target = collector;
        let saved = self.session.save(&mut target, step, |c, gate| {
            // trainer.bin: the step, the epoch (0-based) and its batches done, the seed.
            let cursor = crate::DataCursor {
                epoch: epoch.saturating_sub(1) as u64,
                position: iteration as u64,
                shuffle_seed: 0,
            };
            let trainer = crate::TrainerState::new(step, cursor, seed);
            let frozen =
                FrozenState::capture_learner(learner, tap, trainer).with_optimizer_read(read);
            c.submit_frozen(frozen, gate, |snapshot| {
                snapshot
                    // Burn's epoch numbering (1-based), which resume reads back.
                    .with_epoch(epoch as u64)
                    .with_meta("source", "ckpt-training-strategy")
                    .with_meta(META_EPOCH_ITERATION, iteration)
                    .with_meta(META_EPOCH_COMPLETE, done)
                    // Resumed from an earlier step and reached this one again: swap atomically.
                    .with_replace(true)
            })
        });
        match saved {
            Ok(()) => self.waits.saved(step),
            Err(e) => self
                .interrupter
                .fail(CheckpointerError::Unknown(e.to_string())),
        }
    }

    /// After an optimizer step: checkpoint when the session says so.
    fn after_step(&mut self, learner: &Learner<M>, epoch: usize, iteration: usize, took: Duration) {
        let in_flight = ckpt_core::SaveTarget::in_flight(&self.collector);
        let b = self
            .session
            .boundary(self.step, took, in_flight, Ok::<_, crate::Error>);
        self.poll();
        if matches!(b, Ok(b) if b.save) {
            self.checkpoint(learner, epoch, iteration, false);
        }
    }
}

impl<M: LearnerModel> SupervisedLearningStrategy<M> for CkptTrainingStrategy {
    fn train(
        &self,
        mut learner: Learner<M>,
        dataloader_train: TrainLoader<M>,
        dataloader_valid: ValidLoader<M>,
        mut training_components: TrainingComponents<M>,
    ) -> LearningResult<M> {
        // Same as Burn's default `train`, except that the starting epoch comes from the
        // restored checkpoint's manifest (its key is a step, not an epoch).
        let interrupter = training_components.interrupter.clone();
        self.report_recovery();
        match training_components.checkpoint {
            None if self.resume_latest => match self.restore_latest(&mut learner) {
                Ok(step) => training_components.checkpoint = step,
                Err(e) => interrupter.fail(e),
            },
            // `.checkpoint(n)` without checkpointers registered with Burn (this strategy saves
            // through its own): Burn restored nothing, so the strategy does.
            Some(step) if training_components.checkpointer.is_none() => {
                if let Err(e) = self.restore_step(&mut learner, step) {
                    interrupter.fail(e);
                }
            }
            _ => {}
        }
        let starting_epoch = match training_components.checkpoint {
            Some(step) => match self.resume_point(step) {
                Ok(p) => {
                    *self.resume.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                    p.epoch
                }
                Err(e) => {
                    interrupter.fail(CheckpointerError::Unknown(e.to_string()));
                    1
                }
            },
            None => 1,
        };
        train_from_epoch(
            self,
            learner,
            dataloader_train,
            dataloader_valid,
            training_components,
            starting_epoch,
        )
    }

    fn fit(
        &self,
        components: TrainingComponents<M>,
        mut learner: Learner<M>,
        dataloader_train: TrainLoader<M>,
        dataloader_valid: ValidLoader<M>,
        starting_epoch: usize,
    ) -> (M, SupervisedTrainingEventProcessor<M>) {
        let dataloader_train = dataloader_train.to_device(&self.device);
        let train_total = dataloader_train.num_items();
        let dataloader_valid = dataloader_valid.to_device(&self.device.clone().inner());
        learner.fork(&self.device);

        let cached = self.resume.lock().unwrap_or_else(|e| e.into_inner()).take();
        let resume = match (cached, components.checkpoint) {
            (Some(p), Some(step)) if p.step == step as u64 => Some(p),
            (_, Some(step)) => match self.resume_point(step) {
                Ok(p) => Some(p),
                Err(e) => {
                    // Never a silent fresh start: later saves would replace existing steps.
                    components
                        .interrupter
                        .fail(CheckpointerError::Unknown(e.to_string()));
                    return (learner.model(), components.event_processor);
                }
            },
            (_, None) => None,
        };
        // A fresh run in a used root is refused before any training; a resumed one rewinds.
        if let Err(e) = self.collector.settle() {
            components
                .interrupter
                .fail(CheckpointerError::Unknown(e.to_string()));
            return (learner.model(), components.event_processor);
        }
        let TrainingComponents {
            interrupter,
            mut early_stopping,
            mut event_processor,
            event_store,
            num_epochs,
            grad_accumulation,
            ..
        } = components;
        let mut session = SessionConfig::new(self.policy).memory_budget(self.tuning.budget());
        // Epoch ends and stops are saved whatever the frequency.
        session.enabled = true;
        let mut run = Run {
            tap: LearnerTap::new(event_store.clone()),
            interrupter: interrupter.clone(),
            collector: &self.collector,
            session: CheckpointSession::new(session),
            step: resume.map_or(0, |p| p.step),
            seed: self.deterministic.unwrap_or(0),
            optimizer_read: self.tuning.read(),
            waits: UpdateWaits::default(),
        };
        // An update waits until the save has given the learner's state back (Burn's records of
        // the frozen clone are taken beside the forward and backward passes), instead of
        // copying it on write: `auto` waits on this route on host memory too (see
        // `UpdateWait::Auto`).
        let wait_before_update = self.tuning.wait().applies_to_learner(&self.device);
        if let Some(p) = resume {
            run.session.resumed_at(p.step);
        }

        // Burn's shuffled loaders draw a new order at every `iter()` from an RNG that starts
        // afresh in each process: replay the earlier epochs' draws, so the resumed epoch sees
        // the order the uninterrupted run saw.
        if resume.is_some() {
            for _ in 1..starting_epoch {
                drop(dataloader_train.iter());
            }
        }
        for epoch in starting_epoch..=num_epochs {
            interrupter.fail_on_error(event_processor.process_train(LearnerEvent::StartSplit {
                epoch_number: epoch,
                total_items: train_total,
            }));

            // Training epoch (burn-train's SingleDeviceTrainEpoch, plus checkpoints).
            let skip = match resume {
                Some(p) if p.epoch == epoch => p.skip,
                _ => 0,
            };
            let mut iterator = dataloader_train.iter();
            let mut iteration = 0usize;
            let mut accumulator = GradientsAccumulator::new();
            let mut accumulated = 0usize;
            let mut stopped = false;
            while let Some(item) = iterator.next() {
                let item = match item {
                    Ok(item) => item,
                    Err(err) => {
                        interrupter.fail(err);
                        break;
                    }
                };
                iteration += 1;
                if iteration <= skip {
                    continue;
                }
                let t0 = Instant::now();
                let item_progress = iterator.progress();
                // Seeding and the pass that draws hold the process-wide RNG lock, so other
                // deterministic trainings in this process (ZeRO ranks too) cannot interleave.
                let out = crate::seeded_pass(
                    &self.device,
                    self.deterministic,
                    run.step + 1,
                    accumulated as u64,
                    || learner.train_step(item),
                );
                let stepped = match grad_accumulation {
                    Some(n) => {
                        accumulator.accumulate(&learner.model(), out.grads);
                        accumulated += 1;
                        if n <= accumulated || item_progress.is_completed() {
                            run.waits.before_update(wait_before_update);
                            learner.lr_step();
                            learner.optimizer_step(accumulator.grads());
                            accumulated = 0;
                            true
                        } else {
                            false
                        }
                    }
                    None => {
                        run.waits.before_update(wait_before_update);
                        learner.lr_step();
                        learner.optimizer_step(out.grads);
                        true
                    }
                };
                let took = t0.elapsed();
                let item = TrainingItem::new(
                    out.item,
                    item_progress,
                    Some(iteration),
                    Some(learner.lr_current()),
                );
                interrupter.fail_on_error(
                    event_processor.process_train(LearnerEvent::ProcessedItem(item)),
                );
                if stepped {
                    run.step += 1;
                    run.after_step(&learner, epoch, iteration, took);
                }
                if interrupter.should_stop() {
                    // A stop (not an error) at a step boundary: save where training stopped.
                    if self.save_on_stop && interrupter.error().is_none() && accumulated == 0 {
                        run.checkpoint(&learner, epoch, iteration, false);
                    }
                    stopped = true;
                    break;
                }
            }
            interrupter.fail_on_error(event_processor.process_train(LearnerEvent::EndSplit(epoch)));
            if stopped || interrupter.should_stop() {
                break;
            }

            valid_epoch(
                &learner,
                &dataloader_valid,
                epoch,
                &mut event_processor,
                &interrupter,
            );
            if interrupter.should_stop() {
                // Stopped during validation: the epoch's training is done; its validation
                // reruns on resume.
                if self.save_on_stop && interrupter.error().is_none() {
                    run.checkpoint(&learner, epoch, iteration, false);
                }
                break;
            }
            if self.save_at_epoch_end {
                // Skipped when the epoch's last step was just saved: resuming from that one
                // skips every iteration of the epoch and reruns only its validation.
                run.checkpoint(&learner, epoch, iteration, true);
            }
            if let Some(es) = &mut early_stopping
                && es.should_stop(epoch, &event_store)
            {
                break;
            }
        }
        run.poll();
        run.summarize();
        (learner.model(), event_processor)
    }
}

/// Burn's default [`SupervisedLearningStrategy::train`] with the starting epoch chosen by the
/// caller (the default derives it from an epoch-keyed `.checkpoint(n)`): emits the start event,
/// runs `strategy.fit`, emits the end event with the summary, flushes and builds the result.
pub fn train_from_epoch<M: LearnerModel, S: SupervisedLearningStrategy<M> + ?Sized>(
    strategy: &S,
    learner: Learner<M>,
    dataloader_train: TrainLoader<M>,
    dataloader_valid: ValidLoader<M>,
    mut components: TrainingComponents<M>,
    starting_epoch: usize,
) -> LearningResult<M> {
    let interrupter = components.interrupter.clone();
    let summary_config = components.summary.clone();
    interrupter.fail_on_error(
        components
            .event_processor
            .process_train(LearnerEvent::Start {
                total_epochs: components.num_epochs,
                starting_epoch,
                label: components.label.clone(),
            }),
    );
    let (model, mut event_processor) = strategy.fit(
        components,
        learner,
        dataloader_train,
        dataloader_valid,
        starting_epoch,
    );
    let summary = summary_config.and_then(|s| s.init().ok());
    interrupter.fail_on_error(event_processor.process_train(LearnerEvent::End(summary)));
    let model = model.valid();
    interrupter.fail_on_error(event_processor.flush());
    let renderer = event_processor.renderer();
    LearningResult::<M> {
        model,
        renderer,
        interrupted: interrupter.interruption(),
        error: interrupter.error(),
    }
}

/// One validation epoch of `learner`'s model (burn-train's `SingleDeviceValidEpoch`) with its
/// events, then the end-of-epoch event and a flush. Stops early when `interrupter` says so.
pub fn valid_epoch<M: LearnerModel>(
    learner: &Learner<M>,
    loader: &ValidLoader<M>,
    epoch: usize,
    events: &mut SupervisedTrainingEventProcessor<M>,
    interrupter: &Interrupter,
) {
    interrupter.fail_on_error(events.process_valid(LearnerEvent::StartSplit {
        epoch_number: epoch,
        total_items: loader.num_items(),
    }));
    let model = learner.model().valid();
    let mut iterator = loader.iter();
    let mut iteration = 0usize;
    while let Some(item) = iterator.next() {
        let item = match item {
            Ok(item) => item,
            Err(err) => {
                interrupter.fail(err);
                break;
            }
        };
        let progress = iterator.progress();
        iteration += 1;
        let out = InferenceStep::step(&model, item);
        let item = TrainingItem::new(out, progress, Some(iteration), None);
        interrupter.fail_on_error(events.process_valid(LearnerEvent::ProcessedItem(item)));
        if interrupter.should_stop() {
            break;
        }
    }
    interrupter.fail_on_error(events.process_valid(LearnerEvent::EndSplit(epoch)));
    interrupter.fail_on_error(events.process_train(LearnerEvent::EndEpoch(epoch)));
    interrupter.fail_on_error(events.flush());
}
