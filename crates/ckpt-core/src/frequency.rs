//! When to checkpoint: every N steps, every T seconds, or as often as an overhead budget
//! allows (CheckFreq style).
//!
//! The budget controller measures, online, the step time without a persist running, the step
//! time while one runs (the difference is interference), the stall per save and the persist
//! time. With per-save cost `C = stall + interference` and step time `t`, saving every `k` steps
//! costs `C / (k t)` of the run, so it picks the smallest `k` with `C / (k t) <= 0.9 budget`, and
//! at least enough steps for the previous persist to finish: a save never starts while the
//! previous one is still persisting. Time is passed in by the caller, so the controller runs
//! the same under a simulated clock.

use std::time::Duration;

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
        /// Steps to measure before the first save.
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
    start_step: Option<u64>,
    step_idle: Ewma,
    step_busy: Ewma,
    stall: Ewma,
    persist: Ewma,
}

impl FrequencyController {
    /// Fraction of the budget the controller aims at, leaving room for estimation noise.
    pub const HEADROOM: f64 = 0.9;

    /// A controller for `policy`.
    pub fn new(policy: FrequencyPolicy) -> Self {
        Self {
            policy,
            last_save_step: None,
            last_save_at: None,
            start_step: None,
            step_idle: Ewma::default(),
            step_busy: Ewma::default(),
            stall: Ewma::default(),
            persist: Ewma::default(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> FrequencyPolicy {
        self.policy
    }

    /// Records one training step's time (without any checkpoint stall), and whether a persist
    /// was running during it.
    pub fn observe_step(&mut self, step_time: Duration, persisting: bool) {
        let t = step_time.as_secs_f64();
        if persisting {
            self.step_busy.add(t)
        } else {
            self.step_idle.add(t)
        }
    }

    /// Records a finished save: stall on the training thread and persist time.
    pub fn observe_save(&mut self, stall: Duration, persist: Duration) {
        self.stall.add(stall.as_secs_f64());
        self.persist.add(persist.as_secs_f64());
    }

    /// Estimated per-save cost in seconds: stall plus interference.
    pub fn cost_per_save(&self) -> Option<f64> {
        let stall = self.stall.get()?;
        let persist = self.persist.get()?;
        let idle = self.step_idle.get()?;
        let interference = match self.step_busy.get() {
            Some(busy) if busy > idle => (busy - idle) * (persist / busy).ceil(),
            _ => 0.0,
        };
        Some(stall + interference)
    }

    /// The interval in steps in force: fixed for `EverySteps`, chosen for a budget once a save
    /// has been measured, `None` otherwise.
    pub fn interval(&self) -> Option<u64> {
        match self.policy {
            FrequencyPolicy::EverySteps(n) => Some(n.max(1)),
            FrequencyPolicy::OverheadBudget { fraction, .. } => {
                let t = self.step_idle.get()?.max(1e-9);
                let cost = self.cost_per_save()?;
                let persist = self.persist.get()? + self.stall.get()?;
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
        Some(self.cost_per_save()? / (k.max(1) as f64 * self.step_idle.get()?))
    }

    /// Whether to checkpoint after `step`; `now` is time since the run started and
    /// `persisting` whether a previous save is still being written. Call [`Self::saved`] when
    /// a save is taken.
    pub fn should_save(&mut self, step: u64, now: Duration, persisting: bool) -> bool {
        let start = *self.start_step.get_or_insert(step.saturating_sub(1));
        match self.policy {
            FrequencyPolicy::Never => false,
            FrequencyPolicy::EverySteps(n) => n > 0 && step.is_multiple_of(n),
            FrequencyPolicy::EverySeconds(s) => {
                let since = self.last_save_at.unwrap_or(Duration::ZERO);
                now.saturating_sub(since).as_secs_f64() >= s
            }
            FrequencyPolicy::OverheadBudget { warmup_steps, .. } => {
                if persisting {
                    return false;
                }
                match (self.interval(), self.last_save_step) {
                    (Some(k), Some(last)) => step >= last + k,
                    // No measured save yet: take one after the warm-up to measure it.
                    _ => self.last_save_step.is_none() && step >= start + warmup_steps.max(1),
                }
            }
        }
    }

    /// Records that a save was taken at `step`, time `now`.
    pub fn saved(&mut self, step: u64, now: Duration) {
        self.last_save_step = Some(step);
        self.last_save_at = Some(now);
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
}
