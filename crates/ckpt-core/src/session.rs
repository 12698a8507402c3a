//! One checkpointing session per training run: the per-step decision and every policy around
//! it, so each training loop keeps only what is its own (how to capture its state, and on
//! several ranks how they agree).
//!
//! A [`CheckpointSession`] owns:
//! - the frequency ([`FrequencyController`]: fixed steps, seconds or an overhead budget);
//! - memory-budget routing ([`MemoryGate`]: a save whose background peak would exceed the
//!   budget still persists in the background, but training waits after submitting it until
//!   what it still holds fits the budget);
//! - backpressure accounting (skipped saves, time blocked for a slot, saves in flight);
//! - the save-error policy ([`SaveErrorPolicy`]);
//! - stop requests with a grace period, and the final save;
//! - the report's save records ([`SessionReport`]).
//!
//! The loop calls [`CheckpointSession::boundary`] after every optimizer step, then
//! [`CheckpointSession::save`] when it says so, [`CheckpointSession::poll`] every step, and
//! [`CheckpointSession::finish`] at the end. Where the state goes is a [`SaveTarget`]: the
//! [`Engine`](crate::Engine) on one rank, a sharded saver on several.
//!
//! ```no_run
//! use ckpt_core::{CheckpointSession, Engine, EngineConfig, FrequencyPolicy, SessionConfig,
//!                 SaveRoute, Snapshot, Submitted};
//! # fn main() -> Result<(), ckpt_core::Error> {
//! let (mut engine, _) = Engine::open(EngineConfig::new("runs/demo"))?;
//! let mut session = CheckpointSession::new(
//!     SessionConfig::new(FrequencyPolicy::EverySteps(10)).end_step(100),
//! );
//! for step in 1..=100 {
//!     let t = std::time::Instant::now();
//!     // ... one optimizer step ...
//!     let b = session.boundary(step, t.elapsed(), engine.in_flight(), |p| {
//!         Ok::<_, ckpt_core::Error>(p)
//!     })?;
//!     if b.save {
//!         session.save(&mut engine, step, |e, _gate| {
//!             let outcome = e.submit(Snapshot::new(step).with_bytes("state.bin", vec![0; 64]))?;
//!             Ok::<_, ckpt_core::Error>(Submitted { outcome, route: SaveRoute::Background })
//!         })?;
//!     }
//!     session.poll(&mut engine)?;
//!     if b.stop { break; }
//! }
//! let report = session.finish(engine, |e| Ok(e.finish()?.events))?;
//! println!("{} checkpoints", report.saves.len());
//! # Ok(()) }
//! ```

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde::Serialize;

pub use crate::frequency::FrequencyController;
pub use crate::gate::{MemoryGate, SaveMemory, SaveRoute, Submitted};
pub use crate::held::{AUTO_BUDGET_FRACTION, auto_snapshot_budget};
pub use crate::report::{FailedSave, LostTime, SaveRecord, SessionReport, StopOutcome, StopReport};
pub use crate::target::{SaveFailure, SaveTarget};
use crate::{FrequencyPolicy, SaveEvent, engine::SubmitOutcome};

/// What the session does when a checkpoint fails to persist (disk full, I/O error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveErrorPolicy {
    /// Stop training and return the error (it names the step and the file).
    #[default]
    Stop,
    /// Count the failed save in [`SessionReport::failed_saves`], warn, and keep training;
    /// later saves are attempted as usual. A failure of the run's final checkpoint still
    /// stops the run with the error, since nothing would be left to resume the last steps from.
    Continue,
}

/// One rank's view of a step boundary, before the ranks agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proposal {
    /// The frequency policy wants a checkpoint here.
    pub save: bool,
    /// A stop was requested (a signal, an interrupter).
    pub stop: bool,
}

/// What the loop does at a step boundary, as agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boundary {
    /// Checkpoint this step (call [`CheckpointSession::save`]).
    pub save: bool,
    /// Stop after this step: its checkpoint is the run's final one.
    pub stop: bool,
    /// This step is the run's last ([`SessionConfig::end_step`], or the step a stop agreed
    /// on): the loop ends here.
    pub last: bool,
}

/// Settings of a [`CheckpointSession`].
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// When to checkpoint.
    pub policy: FrequencyPolicy,
    /// What a failed save does.
    pub on_save_error: SaveErrorPolicy,
    /// Cooperative stop request (set by a signal handler), checked at every boundary.
    pub stop: Option<Arc<AtomicBool>>,
    /// Longest wait for the final checkpoint after a stop (`None`: as long as it takes).
    pub grace_period: Option<Duration>,
    /// Extra memory a save may take (`None`: no limit).
    pub memory_budget: Option<u64>,
    /// The step the run ends at, always checkpointed (`None`: unknown, e.g. epoch-driven).
    pub end_step: Option<u64>,
    /// Checkpoint every step the frequency picks, and the final one; `false` turns
    /// checkpointing off (also the final save).
    pub enabled: bool,
}

impl SessionConfig {
    /// A session saving per `policy` ([`FrequencyPolicy::Never`] turns checkpointing off),
    /// stopping on error, no stop flag, no budget, no known end.
    pub fn new(policy: FrequencyPolicy) -> Self {
        Self {
            enabled: policy != FrequencyPolicy::Never,
            policy,
            on_save_error: SaveErrorPolicy::Stop,
            stop: None,
            grace_period: None,
            memory_budget: None,
            end_step: None,
        }
    }

    /// The step the run ends at (always checkpointed).
    pub fn end_step(mut self, step: u64) -> Self {
        self.end_step = Some(step);
        self
    }

    /// What a failed save does.
    pub fn on_save_error(mut self, p: SaveErrorPolicy) -> Self {
        self.on_save_error = p;
        self
    }

    /// A stop flag checked at every step boundary, and the grace period for the final save.
    pub fn stop_on(mut self, flag: Arc<AtomicBool>, grace: Option<Duration>) -> Self {
        self.stop = Some(flag);
        self.grace_period = grace;
        self
    }

    /// Extra memory (bytes) a save may take (`None`: no limit).
    pub fn memory_budget(mut self, bytes: Option<u64>) -> Self {
        self.memory_budget = bytes;
        self
    }
}

/// The per-step checkpoint decision and its policies for one training run. See the module
/// docs.
#[derive(Debug)]
pub struct CheckpointSession {
    cfg: SessionConfig,
    ctrl: FrequencyController,
    gate: MemoryGate,
    started: Instant,
    stalls: BTreeMap<u64, Duration>,
    events: Vec<SaveEvent>,
    report: SessionReport,
    final_step: Option<u64>,
    stopped_at: Option<(u64, Instant)>,
    last_saved: Option<u64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl CheckpointSession {
    /// A session with `cfg`; its clock (for time-based policies) starts now.
    pub fn new(cfg: SessionConfig) -> Self {
        Self {
            ctrl: FrequencyController::new(cfg.policy),
            gate: MemoryGate {
                budget: cfg.memory_budget,
                ..Default::default()
            },
            started: Instant::now(),
            stalls: BTreeMap::new(),
            events: Vec::new(),
            report: SessionReport::default(),
            final_step: cfg.end_step,
            stopped_at: None,
            last_saved: None,
            cfg,
        }
    }

    /// Whether checkpointing is on.
    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// The frequency controller (for policies and estimates).
    pub fn frequency(&self) -> &FrequencyController {
        &self.ctrl
    }

    /// Checkpoints published so far.
    pub fn published(&self) -> usize {
        self.events.len()
    }

    /// What the saves have cost so far (the report [`Self::finish`] completes).
    pub fn report(&self) -> &SessionReport {
        &self.report
    }

    /// Whether the stop flag is set.
    pub fn stop_requested(&self) -> bool {
        self.cfg
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Marks `step` as already saved (a resumed run starts from a checkpoint of it), so a
    /// save forced at the same step, e.g. at the end of its epoch, is not taken twice.
    pub fn resumed_at(&mut self, step: u64) {
        self.last_saved = Some(step);
    }

    /// The step boundary after `step` (its optimizer update took `step_time`; `in_flight`
    /// saves are persisting). `agree` turns this rank's [`Proposal`] into the one every rank
    /// follows (on one rank: `|p| Ok(p)`; on several, for example, rank 0's `save` and any
    /// rank's `stop`, over the training collective). A stop requested before the run's last
    /// step makes this step's checkpoint the final one.
    pub fn boundary<E>(
        &mut self,
        step: u64,
        step_time: Duration,
        in_flight: usize,
        agree: impl FnOnce(Proposal) -> Result<Proposal, E>,
    ) -> Result<Boundary, E> {
        let persisting = in_flight > 0;
        self.report.max_in_flight_seen = self.report.max_in_flight_seen.max(in_flight);
        self.ctrl.observe_step(step_time, persisting);
        let before_end = self.cfg.end_step.is_none_or(|end| step < end);
        let local = Proposal {
            save: self.cfg.enabled
                && self
                    .ctrl
                    .should_save(step, self.started.elapsed(), persisting),
            stop: before_end && self.stop_requested(),
        };
        let agreed = agree(local)?;
        if agreed.stop {
            self.final_step = Some(step);
            self.stopped_at = Some((step, Instant::now()));
        }
        let is_final = self.final_step == Some(step);
        let save = self.cfg.enabled && (agreed.save || is_final) && self.last_saved != Some(step);
        Ok(Boundary {
            save,
            stop: agreed.stop,
            last: is_final,
        })
    }

    /// Forces a checkpoint of `step` at the next [`Self::save`] even where the frequency would
    /// not take one (end of an epoch, a stop the loop noticed itself): whether to call it.
    pub fn should_force(&self, step: u64) -> bool {
        self.cfg.enabled && self.last_saved != Some(step)
    }

    /// Checkpoints `step`. `capture` takes the loop's state and submits it to `target`; it
    /// gets the [`MemoryGate`] to route by the budget and says which route it took. The
    /// session handles the rest: earlier failures first (through the error policy), a skipped
    /// final save retried after the pipeline drains, a blocking route waited for, the stall
    /// timed and the frequency told. `capture` may be called again after an earlier save's
    /// failure surfaced at submit.
    pub fn save<T, E>(
        &mut self,
        target: &mut T,
        step: u64,
        mut capture: impl FnMut(&mut T, &mut MemoryGate) -> Result<Submitted, E>,
    ) -> Result<(), E>
    where
        T: SaveTarget,
        E: SaveFailure + From<T::Error>,
    {
        let t0 = Instant::now();
        // Failures of earlier saves first, so this one is not refused for them.
        let polled = self.drain(target, false).map_err(E::from)?;
        self.record(polled);
        let mut sync_events = Vec::new();
        loop {
            self.gate.in_flight = target.in_flight();
            self.gate.held_now = target.held_bytes();
            match capture(target, &mut self.gate) {
                Ok(Submitted { outcome, route }) => {
                    match route {
                        SaveRoute::Blocking => self.report.blocking_saves.push(step),
                        SaveRoute::Throttled => self.report.throttled_saves.push(step),
                        SaveRoute::Background => {}
                    }
                    match outcome {
                        SubmitOutcome::Skipped { .. } if Some(step) == self.final_step => {
                            // The final checkpoint is never skipped: wait for a slot.
                            let done = self.drain(target, true).map_err(E::from)?;
                            self.record(done);
                            continue;
                        }
                        SubmitOutcome::Skipped { .. } => {
                            self.report.skipped += 1;
                        }
                        SubmitOutcome::WrittenSync(ev) => sync_events.push(ev),
                        SubmitOutcome::Queued { .. } if route == SaveRoute::Blocking => {
                            sync_events.extend(self.drain(target, true).map_err(E::from)?);
                        }
                        SubmitOutcome::Queued { .. } if route == SaveRoute::Throttled => {
                            let limit = self
                                .gate
                                .wait_limit
                                .or(self.gate.budget)
                                .unwrap_or(u64::MAX);
                            if !target.wait_held_at_most(limit).map_err(E::from)? {
                                if self.report.throttled_saves.len() == 1 {
                                    tracing::warn!(
                                        step,
                                        "this checkpoint target does not count the memory its \
                                         saves hold: training waits for each save over the \
                                         budget to be durable"
                                    );
                                }
                                sync_events.extend(self.drain(target, true).map_err(E::from)?);
                            }
                        }
                        SubmitOutcome::Queued { .. } => {}
                    }
                    break;
                }
                Err(err) => {
                    // An earlier save's failure surfaced here: retry this one.
                    let about_this_step = err.failed_step() == Some(step);
                    self.failed(err)?;
                    if about_this_step {
                        break;
                    }
                }
            }
        }
        self.report.max_in_flight_seen = self.report.max_in_flight_seen.max(target.in_flight());
        let stall = t0.elapsed();
        self.stalls.insert(step, stall);
        self.last_saved = Some(step);
        self.ctrl
            .saved_after_stall(step, self.started.elapsed(), stall);
        self.record(sync_events);
        Ok(())
    }

    /// Non-blocking, every step: published checkpoints are recorded and told to the frequency
    /// controller; failures go through the error policy.
    pub fn poll<T: SaveTarget>(&mut self, target: &mut T) -> Result<(), T::Error> {
        self.report.max_in_flight_seen = self.report.max_in_flight_seen.max(target.in_flight());
        let evs = self.drain(target, false)?;
        self.record(evs);
        Ok(())
    }

    /// Ends the session: after a stop, waits for the final checkpoint at most the grace
    /// period (when it runs out, `target` is closed on a helper thread, so the caller is free
    /// to exit; an unfinished save is then never published); otherwise waits for every save
    /// and closes `target` with `close`, which returns the events not yet reported.
    pub fn finish<T>(
        mut self,
        mut target: T,
        close: impl FnOnce(T) -> Result<Vec<SaveEvent>, T::Error> + Send + 'static,
    ) -> Result<SessionReport, T::Error>
    where
        T: SaveTarget + Send + 'static,
    {
        let t_finish = Instant::now();
        let mut outcome = if self.cfg.enabled {
            StopOutcome::Saved
        } else {
            StopOutcome::NotSaved
        };
        if let (Some((_, t_stop)), Some(grace)) = (self.stopped_at, self.cfg.grace_period) {
            while target.in_flight() > 0 && t_stop.elapsed() < grace {
                std::thread::sleep(Duration::from_millis(2));
                self.poll(&mut target)?;
            }
            if target.in_flight() > 0 {
                outcome = StopOutcome::GraceExpired;
            }
        }
        self.report.blocked_ms = ms(target.blocked_total());
        if outcome == StopOutcome::GraceExpired {
            self.poll(&mut target)?;
            // Closing joins the persist thread, which a stalled disk can hold up for any time.
            let _ = std::thread::Builder::new()
                .name("ckpt-late-finish".into())
                .spawn(move || {
                    if let Err(e) = close(target) {
                        tracing::warn!(error = %e, "the unfinished checkpoint failed after the grace period");
                    }
                });
        } else {
            let evs = self.drain(&mut target, true)?;
            self.record(evs);
            self.report.blocked_ms = ms(target.blocked_total());
            let evs = close(target)?;
            self.record(evs);
        }
        if self.report.throttled_saves.len() > 1 {
            tracing::warn!(
                "training waited after {} saves until what they held fit the snapshot memory \
                 budget (steps {:?})",
                self.report.throttled_saves.len(),
                self.report.throttled_saves
            );
        }
        let (base, during) = self.ctrl.lost();
        let final_wait = t_finish.elapsed().as_secs_f64();
        let mut report = self.report;
        let total = (during + final_wait) * 1e3;
        report.lost = LostTime {
            baseline_step_ms: base.map(|b| b * 1e3),
            baseline_steps: self.ctrl.baseline_steps(),
            during_training_ms: during * 1e3,
            final_wait_ms: final_wait * 1e3,
            total_ms: total,
            per_save_ms: (!report.saves.is_empty()).then(|| total / report.saves.len() as f64),
        };
        report.saves.sort_by_key(|s| s.step);
        report.interval = self.ctrl.interval();
        report.stopped = self.stopped_at.map(|(step, t)| StopReport {
            step,
            outcome,
            wait_ms: ms(t.elapsed()),
        });
        Ok(report)
    }

    /// Published events from `target` (all of them when `wait`), failures through the policy.
    fn drain<T: SaveTarget>(
        &mut self,
        target: &mut T,
        wait: bool,
    ) -> Result<Vec<SaveEvent>, T::Error> {
        let mut out = Vec::new();
        loop {
            let r = if wait {
                target.wait_idle()
            } else {
                target.poll()
            };
            match r {
                Ok(evs) => {
                    out.extend(evs);
                    return Ok(out);
                }
                Err(err) => self.failed(err)?,
            }
        }
    }

    /// Applies [`SaveErrorPolicy`]: under `Continue`, a failed save that does not lose the
    /// run's final checkpoint is recorded (and warned about) and training goes on; everything
    /// else is returned.
    fn failed<E: SaveFailure>(&mut self, err: E) -> Result<(), E> {
        let loses_final = err.failed_step().is_some()
            && err.failed_step() == self.final_step
            && !err.after_publication();
        if self.cfg.on_save_error == SaveErrorPolicy::Continue
            && err.is_save_failure()
            && !loses_final
        {
            tracing::warn!(error = %err, "checkpoint failed; training continues (--on-save-error continue)");
            self.report.failed_saves.push(FailedSave {
                step: err.failed_step(),
                error: err.to_string(),
            });
            return Ok(());
        }
        Err(err)
    }

    /// Records published saves with the whole stall the training thread saw for each, and
    /// tells the frequency controller.
    fn record(&mut self, published: impl IntoIterator<Item = SaveEvent>) {
        for ev in published {
            let stall = self.stalls.get(&ev.step).copied().unwrap_or(ev.stall);
            self.ctrl.observe_save(stall, ev.persist);
            self.gate.previous_bytes = Some(ev.bytes);
            self.report.saves.push(SaveRecord {
                step: ev.step,
                stall_ms: ms(stall),
                persist_ms: Some(ms(ev.persist)),
                bytes: ev.bytes,
                blocked_ms: ms(ev.blocked),
            });
            self.events.push(ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// A save's memory need: held in the background, held at the least, needed for a moment.
    fn mem(background: u64, blocking: u64, transient: u64) -> SaveMemory {
        SaveMemory {
            background,
            blocking,
            transient,
        }
    }

    /// A target whose saves publish at the next poll, or fail when told to.
    #[derive(Default)]
    struct Fake {
        queued: Vec<u64>,
        fail_next: bool,
    }

    impl SaveTarget for Fake {
        type Error = Error;
        fn held_bytes(&self) -> Option<u64> {
            None
        }
        fn wait_held_at_most(&mut self, _limit: u64) -> Result<bool, Error> {
            Ok(false)
        }
        fn in_flight(&self) -> usize {
            self.queued.len()
        }
        fn poll(&mut self) -> Result<Vec<SaveEvent>, Error> {
            let q = std::mem::take(&mut self.queued);
            if std::mem::take(&mut self.fail_next)
                && let Some(&step) = q.first()
            {
                return Err(Error::Persist {
                    step,
                    stage: crate::Stage::WritePart,
                    path: "x".into(),
                    source: std::io::Error::other("ENOSPC"),
                });
            }
            Ok(q.into_iter()
                .map(|step| SaveEvent {
                    step,
                    path: "x".into(),
                    bytes: 1,
                    stall: Duration::ZERO,
                    blocked: Duration::ZERO,
                    persist: Duration::ZERO,
                    to_durable: Duration::ZERO,
                    sync: false,
                    removed: vec![],
                })
                .collect())
        }
        fn wait_idle(&mut self) -> Result<Vec<SaveEvent>, Error> {
            self.poll()
        }
    }

    fn run(cfg: SessionConfig, steps: u64, fail_at: Option<u64>) -> Result<SessionReport, Error> {
        let mut s = CheckpointSession::new(cfg);
        let mut t = Fake::default();
        for step in 1..=steps {
            let b = s.boundary(step, Duration::from_millis(1), t.in_flight(), |p| {
                Ok::<_, Error>(p)
            })?;
            if b.save {
                s.save(&mut t, step, |t: &mut Fake, _| {
                    t.queued.push(step);
                    t.fail_next = fail_at == Some(step);
                    Ok::<_, Error>(Submitted {
                        outcome: SubmitOutcome::Queued {
                            step,
                            blocked: Duration::ZERO,
                        },
                        route: SaveRoute::Background,
                    })
                })?;
            }
            s.poll(&mut t)?;
            if b.stop {
                break;
            }
        }
        s.finish(t, |_| Ok(vec![]))
    }

    #[test]
    fn final_step_is_always_saved() {
        let r = run(
            SessionConfig::new(FrequencyPolicy::EverySteps(4)).end_step(10),
            10,
            None,
        )
        .unwrap();
        let steps: Vec<u64> = r.saves.iter().map(|s| s.step).collect();
        assert_eq!(steps, vec![4, 8, 10]);
    }

    #[test]
    fn stop_saves_the_stop_step() {
        let flag = Arc::new(AtomicBool::new(true));
        let r = run(
            SessionConfig::new(FrequencyPolicy::EverySteps(4))
                .end_step(10)
                .stop_on(flag, None),
            10,
            None,
        )
        .unwrap();
        assert_eq!(r.saves.len(), 1);
        assert_eq!(r.stopped.as_ref().map(|s| s.step), Some(1));
        assert_eq!(r.stopped.map(|s| s.outcome), Some(StopOutcome::Saved));
    }

    #[test]
    fn error_policy() {
        let cfg = SessionConfig::new(FrequencyPolicy::EverySteps(2)).end_step(6);
        assert!(run(cfg.clone(), 6, Some(2)).is_err(), "stop is the default");
        let r = run(
            cfg.clone().on_save_error(SaveErrorPolicy::Continue),
            6,
            Some(2),
        )
        .unwrap();
        assert_eq!(r.failed_saves.len(), 1);
        assert_eq!(r.failed_saves[0].step, Some(2));
        assert_eq!(r.saves.len(), 2);
        // The final checkpoint's failure stops the run even under `continue`.
        assert!(run(cfg.on_save_error(SaveErrorPolicy::Continue), 6, Some(6)).is_err());
    }

    #[test]
    fn agreement_rules() {
        let mut s = CheckpointSession::new(SessionConfig::new(FrequencyPolicy::EverySteps(100)));
        let b = s
            .boundary(1, Duration::ZERO, 0, |_| {
                Ok::<_, Error>(Proposal {
                    save: true,
                    stop: true,
                })
            })
            .unwrap();
        assert!(b.save && b.stop, "an agreed stop saves its step");
    }

    #[test]
    fn memory_gate_routes_and_counts_held_saves() {
        let mut g = MemoryGate {
            budget: Some(100),
            ..Default::default()
        };
        let need = mem(60, 40, 0);
        assert_eq!(g.route(need, 1), SaveRoute::Background);
        g.in_flight = 1;
        assert_eq!(g.route(need, 2), SaveRoute::Throttled, "60 held + 60 > 100");
        g.in_flight = 0;
        assert_eq!(g.route(need, 3), SaveRoute::Background);
        // What the target counts wins over the estimate.
        g.in_flight = 1;
        g.held_now = Some(30);
        assert_eq!(
            g.route(need, 4),
            SaveRoute::Background,
            "30 still held + 60 fits"
        );
        assert_eq!(g.wait_limit(), None);
    }

    #[test]
    fn a_throttled_save_waits_for_the_budget_or_its_own_floor_whichever_is_more() {
        let mut g = MemoryGate::new(Some(100));
        let over = mem(150, 40, 0);
        assert_eq!(g.route(over, 1), SaveRoute::Throttled);
        assert_eq!(g.wait_limit(), Some(100), "the budget");
        let floor = mem(150, 120, 0);
        assert_eq!(g.route(floor, 2), SaveRoute::Throttled);
        assert_eq!(g.wait_limit(), Some(120), "the floor, over the budget");
        let fits = mem(90, 40, 0);
        assert_eq!(g.route(fits, 3), SaveRoute::Background);
        assert_eq!(g.wait_limit(), None);
    }

    #[test]
    fn the_budget_leaves_room_for_the_encodings_transient_copy() {
        let mut g = MemoryGate::new(Some(100));
        // What it holds fits, but not with the copy its encoding makes for a moment.
        let need = mem(80, 30, 30);
        assert_eq!(g.route(need, 1), SaveRoute::Throttled, "80 held + 30 > 100");
        assert_eq!(
            g.wait_limit(),
            Some(70),
            "training waits until the save holds no more than leaves room for the copy"
        );
        // Training waits only down to the save's own floor.
        let floor = mem(80, 50, 60);
        assert_eq!(g.route(floor, 2), SaveRoute::Throttled);
        assert_eq!(g.wait_limit(), Some(50));
        let fits = mem(70, 30, 30);
        assert_eq!(g.route(fits, 3), SaveRoute::Background, "70 + 30 fits 100");
    }
}
