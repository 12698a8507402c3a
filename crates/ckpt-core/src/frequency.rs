//! When to checkpoint: every N steps, every T seconds, or as often as an overhead budget
//! allows (CheckFreq style).
//!
//! The budget controller measures, online, what each save really costs the training loop: the
//! stall plus the excess, over the baseline step time (the lower quartile of recent steps
//! outside any save), of every step from the save until a few steps after its persist ended.
//! That window catches interference of the persist thread on shared cores and the
//! copy-on-write allocations after a handle-clone capture alike; costs are recomputed from raw
//! step times whenever the baseline moves. The first save, which measures the cost, waits for
//! the warm-up's slow first steps to settle. The controller keeps account of the cost spent so
//! far and takes the next save when the total, plus the estimated cost of that save, stays
//! within 90 % of the budget of the training time; a save never starts while the previous
//! one's window is open, and a few clean steps separate windows so the baseline stays
//! measured. Time is passed in by the caller, so the controller runs the same under a
//! simulated clock.

use std::{collections::VecDeque, time::Duration};

/// The checkpoint frequency policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FrequencyPolicy {
    /// Never checkpoint (except where the caller forces it).
    Never,
    /// Every N optimizer steps (steps that are multiples of N).
    EverySteps(u64),
    /// At the first step boundary at least this many seconds after the previous save.
    EverySeconds(f64),
    /// As often as keeps the checkpoint overhead under `fraction` of the training time.
    OverheadBudget {
        /// Budget, e.g. 0.02 for 2 %.
        fraction: f64,
        /// Steps to measure before the first save, at least: the warm-up goes on until step
        /// times stop falling (up to ten times this).
        warmup_steps: u64,
    },
}

impl FrequencyPolicy {
    /// An overhead budget with a 5-step warm-up.
    pub fn budget(fraction: f64) -> Self {
        FrequencyPolicy::OverheadBudget {
            fraction,
            warmup_steps: 5,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Ewma(Option<f64>);

impl Ewma {
    const ALPHA: f64 = 0.25;
    fn add(&mut self, x: f64) {
        self.0 = Some(match self.0 {
            None => x,
            Some(m) => m + Self::ALPHA * (x - m),
        });
    }
    fn get(&self) -> Option<f64> {
        self.0
    }
}

/// Decides at each step boundary whether to checkpoint.
#[derive(Debug, Clone)]
pub struct FrequencyController {
    policy: FrequencyPolicy,
    last_save_step: Option<u64>,
    last_save_at: Option<Duration>,
    /// Steps observed since the controller was made (the run's start or its resume): the
    /// warm-up counts these, so a caller that asks only at its due steps (the memory tier asks
    /// every `every` steps) is not held back by the steps it did not ask at.
    observed: u64,
    /// Recent step times outside any save's cost window: the baseline.
    clean: VecDeque<f64>,
    /// Clean steps since the newest save's window closed.
    clean_run: u64,
    /// The newest step times, for telling when the warm-up has settled.
    last_steps: VecDeque<f64>,
    /// The cost window of the newest save, while it is still being measured.
    window: Option<Window>,
    /// The newest closed windows, for the per-save cost estimate.
    recent: VecDeque<Window>,
    /// Sums over every closed window: step time, steps, stalls.
    closed_time: f64,
    closed_steps: u64,
    closed_stall: f64,
    step_busy: Ewma,
    stall: Ewma,
    persist: Ewma,
    /// Training time observed so far: every step plus every stall.
    elapsed: f64,
    /// [`Self::TAIL_STEPS`] unless set.
    tail_steps: u64,
    /// [`Self::MIN_CLEAN_STEPS`] unless set.
    min_clean_steps: u64,
}

/// The steps from a save until [`FrequencyController::TAIL_STEPS`] steps after its persist
/// ended: every extra second in them is the save's cost.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    /// The save's step.
    step: u64,
    steps: u64,
    time: f64,
    stall: Option<f64>,
    after: u64,
}

impl Window {
    /// The window's cost against baseline `base`. Costs are always recomputed from the raw
    /// step times, so early windows, measured while the baseline still came from a few slow
    /// warm-up steps, are counted right once it has settled.
    fn cost(&self, base: f64) -> f64 {
        (self.time - self.steps as f64 * base).max(0.0) + self.stall.unwrap_or(0.0)
    }
}

impl FrequencyController {
    /// Fraction of the budget the controller aims at, leaving room for estimation noise.
    pub const HEADROOM: f64 = 0.9;
    /// Steps after a persist ends that still count towards its cost (copy-on-write
    /// allocations, memory returned and faulted in again, caches refilled).
    pub const TAIL_STEPS: u64 = 3;
    /// Clean steps kept for the baseline.
    const BASELINE_STEPS: usize = 64;
    /// Clean steps required between one save's window and the next save, so the baseline
    /// keeps being measured (it would otherwise freeze at the slow warm-up steps when the
    /// budget allows back-to-back saves).
    pub const MIN_CLEAN_STEPS: u64 = 5;
    /// The warm-up lasts until the median of the newest this many steps is no more than 5 %
    /// below that of the this many before (first steps are slow: fresh allocations, caches),
    /// or ten times the configured warm-up, whichever comes first.
    const SETTLE_STEPS: usize = 5;

    /// Whether step times have stopped falling.
    fn settled(&self) -> bool {
        if self.last_steps.len() < 2 * Self::SETTLE_STEPS {
            return false;
        }
        let median = |it: &mut dyn Iterator<Item = f64>| {
            let mut v: Vec<f64> = it.collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let older = median(&mut self.last_steps.iter().copied().take(Self::SETTLE_STEPS));
        let newer = median(&mut self.last_steps.iter().copied().skip(Self::SETTLE_STEPS));
        newer >= 0.95 * older
    }

    /// A controller for `policy`.
    pub fn new(policy: FrequencyPolicy) -> Self {
        Self {
            policy,
            last_save_step: None,
            last_save_at: None,
            observed: 0,
            clean: VecDeque::new(),
            clean_run: 0,
            last_steps: VecDeque::new(),
            window: None,
            recent: VecDeque::new(),
            closed_time: 0.0,
            closed_steps: 0,
            closed_stall: 0.0,
            step_busy: Ewma::default(),
            stall: Ewma::default(),
            persist: Ewma::default(),
            elapsed: 0.0,
            tail_steps: Self::TAIL_STEPS,
            min_clean_steps: Self::MIN_CLEAN_STEPS,
        }
    }

    /// Steps after a persist ends that still count towards its cost (default
    /// [`Self::TAIL_STEPS`]; at least 1). Fewer let a budget allow saves closer together at
    /// the price of missing late costs.
    pub fn tail_steps(mut self, n: u64) -> Self {
        self.tail_steps = n.max(1);
        self
    }

    /// Clean steps required between one save's window and the next save under a budget
    /// (default [`Self::MIN_CLEAN_STEPS`]; at least 1, so the baseline stays measured).
    pub fn min_clean_steps(mut self, n: u64) -> Self {
        self.min_clean_steps = n.max(1);
        self
    }

    /// The policy.
    pub fn policy(&self) -> FrequencyPolicy {
        self.policy
    }

    /// The baseline step time: the lower quartile of recent steps outside any save's cost
    /// window. Not the median: on shared cores, saves also slow the steps between windows a
    /// little (allocator and page-cache churn, caches refilled), and a baseline that rises with
    /// them would hide that part of the cost; the lower quartile errs towards counting it.
    fn baseline(&self) -> Option<f64> {
        if self.clean.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.clean.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 4])
    }

    /// Records one training step's time (without any checkpoint stall), and whether a persist
    /// was running during it.
    pub fn observe_step(&mut self, step_time: Duration, persisting: bool) {
        let t = step_time.as_secs_f64();
        self.observed += 1;
        self.elapsed += t;
        self.last_steps.push_back(t);
        if self.last_steps.len() > 2 * Self::SETTLE_STEPS {
            self.last_steps.pop_front();
        }
        if persisting {
            self.step_busy.add(t);
        }
        let Some(w) = self.window.as_mut() else {
            if !persisting {
                self.clean_run += 1;
                self.clean.push_back(t);
                if self.clean.len() > Self::BASELINE_STEPS {
                    self.clean.pop_front();
                }
            }
            return;
        };
        w.steps += 1;
        w.time += t;
        w.after = if persisting { 0 } else { w.after + 1 };
        if w.after >= self.tail_steps {
            self.close_window();
        }
    }

    /// Windows kept for the per-save estimate.
    const RECENT: usize = 8;

    fn close_window(&mut self) {
        let Some(mut w) = self.window.take() else {
            return;
        };
        w.stall = Some(w.stall.or(self.stall.get()).unwrap_or(0.0));
        self.closed_time += w.time;
        self.closed_steps += w.steps;
        self.closed_stall += w.stall.unwrap_or(0.0);
        self.recent.push_back(w);
        if self.recent.len() > Self::RECENT {
            self.recent.pop_front();
        }
    }

    /// What all saves cost so far, in seconds, against baseline `base`.
    fn spent_at(&self, base: Option<f64>) -> f64 {
        let Some(base) = base else {
            return self.closed_stall;
        };
        (self.closed_time - self.closed_steps as f64 * base).max(0.0) + self.closed_stall
    }

    /// What each of the newest saves cost, in seconds, by step: its stall plus the excess over
    /// the current baseline of the steps in its window (the window still open included, as
    /// measured so far). Empty before there is a baseline. Where saves overlap, a save's
    /// window ends at the next save, which is then charged with the rest.
    pub fn save_costs(&self) -> Vec<(u64, f64)> {
        let Some(base) = self.baseline() else {
            return Vec::new();
        };
        let open = self.window.map(|w| Window {
            stall: Some(w.stall.or(self.stall.get()).unwrap_or(0.0)),
            ..w
        });
        self.recent
            .iter()
            .chain(open.as_ref())
            .map(|w| (w.step, w.cost(base)))
            .collect()
    }

    /// The per-save estimate against baseline `base` (see [`Self::cost_per_save`]).
    fn cost_at(&self, base: f64) -> Option<f64> {
        let costs: Vec<f64> = self.recent.iter().map(|w| w.cost(base)).collect();
        let last = *costs.last()?;
        let mean = costs.iter().sum::<f64>() / costs.len() as f64;
        Some(mean.max(last))
    }

    /// Records a finished save: stall on the training thread and persist time.
    pub fn observe_save(&mut self, stall: Duration, persist: Duration) {
        let s = stall.as_secs_f64();
        self.stall.add(s);
        self.persist.add(persist.as_secs_f64());
        self.elapsed += s;
        if let Some(w) = self.window.as_mut()
            && w.stall.is_none()
        {
            w.stall = Some(s);
        }
    }

    /// Estimated per-save cost in seconds: the stall plus the extra time of the steps from the
    /// save until shortly after its persist ended, over the baseline step time. Conservative:
    /// the larger of the mean of the newest windows and the newest one.
    pub fn cost_per_save(&self) -> Option<f64> {
        self.cost_at(self.baseline()?)
    }

    /// What checkpoints have cost the training loop so far, in seconds, with the baseline step
    /// time it is measured against: every save's stall plus the excess over the baseline of
    /// the steps in its window, the window still open included. Without a baseline yet (no
    /// step outside a save's window) only the stalls are counted.
    pub fn lost(&self) -> (Option<f64>, f64) {
        let base = self.baseline();
        let open = self.window.map_or(0.0, |w| {
            let stall = w.stall.unwrap_or(0.0);
            match base {
                Some(b) => Window {
                    stall: Some(stall),
                    ..w
                }
                .cost(b),
                None => stall,
            }
        });
        (base, self.spent_at(base) + open)
    }

    /// How many steps the baseline step time comes from (a few early steps make it too high:
    /// the warm-up is slow).
    pub fn baseline_steps(&self) -> usize {
        self.clean.len()
    }

    /// Training time so far and the part of it checkpoints cost (measured), in seconds.
    pub fn spent(&self) -> (f64, f64) {
        (self.elapsed, self.spent_at(self.baseline()))
    }

    /// The interval in steps in force: fixed for `EverySteps`; for a budget, once a save has
    /// been measured, the steady-state interval `cost / (0.9 budget × step)` (at least the
    /// steps a persist takes), `None` otherwise.
    pub fn interval(&self) -> Option<u64> {
        match self.policy {
            FrequencyPolicy::EverySteps(n) => Some(n.max(1)),
            FrequencyPolicy::OverheadBudget { fraction, .. } => {
                let t = self.baseline()?.max(1e-9);
                let cost = self.cost_per_save()?;
                let persist = self.persist.get().unwrap_or(0.0) + self.stall.get().unwrap_or(0.0);
                let busy = self.step_busy.get().unwrap_or(t).max(t);
                // Aim a little under the budget: the estimates are noisy and steps are whole.
                let k_budget = (cost / (Self::HEADROOM * fraction.max(1e-9) * t)).ceil();
                let k_overlap = (persist / busy).ceil() + 1.0;
                Some(k_budget.max(k_overlap).clamp(1.0, u64::MAX as f64 / 2.0) as u64)
            }
            _ => None,
        }
    }

    /// Estimated overhead fraction when saving every `k` steps.
    pub fn estimated_overhead(&self, k: u64) -> Option<f64> {
        Some(self.cost_per_save()? / (k.max(1) as f64 * self.baseline()?))
    }

    /// Whether to checkpoint after `step`; `now` is time since the run started and
    /// `persisting` whether a previous save is still being written. Call [`Self::saved`] when
    /// a save is taken.
    ///
    /// Under a budget the controller keeps account: a save is taken when everything saves
    /// have cost so far, plus the estimated cost of this one, stays within 90 % of the budget
    /// of the training time so far (without that cost). The measuring save after the warm-up
    /// is paid back that way, and a save's cost is only known once its window closed, so saves
    /// never overlap.
    pub fn should_save(&mut self, step: u64, now: Duration, persisting: bool) -> bool {
        match self.policy {
            FrequencyPolicy::Never => false,
            FrequencyPolicy::EverySteps(n) => n > 0 && step.is_multiple_of(n),
            FrequencyPolicy::EverySeconds(s) => {
                let since = self.last_save_at.unwrap_or(Duration::ZERO);
                now.saturating_sub(since).as_secs_f64() >= s
            }
            FrequencyPolicy::OverheadBudget {
                fraction,
                warmup_steps,
            } => {
                if persisting
                    || self.window.is_some()
                    || (self.last_save_step.is_some() && self.clean_run < self.min_clean_steps)
                {
                    return false;
                }
                // One baseline (a sort of the recent steps) per decision.
                let base = self.baseline();
                match base.and_then(|b| self.cost_at(b)) {
                    Some(cost) => {
                        let spent = self.spent_at(base);
                        let useful = (self.elapsed - spent).max(0.0);
                        spent + cost <= Self::HEADROOM * fraction * useful
                    }
                    // No measured save yet: take one after the warm-up to measure it.
                    None => {
                        let warm = warmup_steps.max(1);
                        self.last_save_step.is_none()
                            && self.observed >= warm
                            && (self.settled() || self.observed >= 10 * warm)
                    }
                }
            }
        }
    }

    /// [`Self::saved`] for a save whose stall on the training thread is already known (the
    /// session times it): the stall is booked to this save's window at once, not to whichever
    /// window is open when the save's event arrives.
    pub fn saved_after_stall(&mut self, step: u64, now: Duration, stall: Duration) {
        self.saved(step, now);
        if let Some(w) = self.window.as_mut() {
            w.stall = Some(stall.as_secs_f64());
        }
    }

    /// Records that a save was taken at `step`, time `now`; this opens the window in which
    /// the save's cost is measured (the stall arrives with [`Self::observe_save`]).
    pub fn saved(&mut self, step: u64, now: Duration) {
        self.last_save_step = Some(step);
        self.last_save_at = Some(now);
        // Every policy measures what its saves cost (reported as lost time); only the budget
        // policy decides by it.
        self.close_window();
        self.window = Some(Window {
            step,
            ..Window::default()
        });
        self.clean_run = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_steps() {
        let mut f = FrequencyController::new(FrequencyPolicy::EverySteps(10));
        let saves: Vec<u64> = (1..=35)
            .filter(|&s| f.should_save(s, Duration::ZERO, false))
            .collect();
        assert_eq!(saves, vec![10, 20, 30]);
    }

    #[test]
    fn fixed_seconds() {
        let mut f = FrequencyController::new(FrequencyPolicy::EverySeconds(1.0));
        let mut saves = vec![];
        for s in 1..=50u64 {
            let now = Duration::from_millis(s * 100);
            if f.should_save(s, now, false) {
                f.saved(s, now);
                saves.push(s);
            }
        }
        assert_eq!(saves, vec![10, 20, 30, 40, 50]);
    }

    #[test]
    fn save_costs_charge_each_save_with_its_own_window() {
        let ms = Duration::from_millis;
        let mut f = FrequencyController::new(FrequencyPolicy::EverySteps(10));
        assert!(f.save_costs().is_empty(), "no baseline yet");
        for _ in 0..8 {
            f.observe_step(ms(100), false);
        }
        // Save at step 8 (stall 5 ms), then two steps 50 ms slower while it persists.
        f.saved_after_stall(8, ms(800), ms(5));
        f.observe_step(ms(150), true);
        f.observe_step(ms(150), true);
        // Its window is still open: measured so far.
        let open = f.save_costs();
        assert_eq!(open.len(), 1);
        assert!((open[0].1 - 0.105).abs() < 1e-9, "{open:?}");
        for _ in 0..3 {
            f.observe_step(ms(100), false);
        }
        // A second save, 300 ms slower in one step.
        f.saved_after_stall(20, ms(2000), ms(1));
        f.observe_step(ms(400), true);
        let costs = f.save_costs();
        assert_eq!(costs.iter().map(|c| c.0).collect::<Vec<_>>(), vec![8, 20]);
        assert!((costs[0].1 - 0.105).abs() < 1e-9, "{costs:?}");
        assert!((costs[1].1 - 0.301).abs() < 1e-9, "{costs:?}");
    }

    /// The memory tier asks only at its due steps: the warm-up is the steps observed, not
    /// the steps since the first question (which made `every 10` wait until step 30).
    #[test]
    fn a_budget_asked_only_at_due_steps_saves_at_the_first_due_step_after_the_warm_up() {
        let mut f = FrequencyController::new(FrequencyPolicy::budget(0.05))
            .tail_steps(1)
            .min_clean_steps(1);
        let mut saves = vec![];
        for s in 1..=30u64 {
            f.observe_step(Duration::from_millis(100), false);
            if s % 10 == 0 && f.should_save(s, Duration::from_millis(100 * s), false) {
                f.saved_after_stall(s, Duration::from_millis(100 * s), Duration::ZERO);
                saves.push(s);
            }
        }
        assert_eq!(saves, vec![10, 20, 30]);
    }
}
