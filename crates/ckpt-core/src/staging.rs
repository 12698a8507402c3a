//! How a background save takes the model's tensors off the training state, where they are host
//! memory, chosen per save by what it measurably costs training.
//!
//! Two ways, both exact (the snapshot keeps the step's values either way):
//! - [`ModelStaging::Stage`]: a helper thread copies each tensor out at once and drops its
//!   handle, so the next update writes in place. The copy takes CPU from training.
//! - [`ModelStaging::Hold`]: the snapshot keeps the handles and the writer reads each tensor
//!   as it writes it. No copy where training has since replaced the tensor (the writer then
//!   owns the old buffer), but the update that replaced it allocated a fresh one instead of
//!   writing in place.
//!
//! Which loses less training time depends on the machine, the model and the step time, so the
//! [`StagingChooser`] measures it: the run's first save stages as a warm-up whose cost is not
//! counted (the first save in a process pays for its first touch of fresh memory whichever way
//! it goes: in hand runs at 1 GB it cost 1.1-1.4x the next one with either way fixed, which
//! made the way tried first look dearer), the second stages and the third holds, both measured,
//! later saves take the cheaper of the two by the median cost of their newest saves, and every
//! [`StagingChooser::REPROBE_EVERY`] saves the other way is tried once again, so a change in the
//! run (another job on the machine, a larger batch) is followed. Costs are the frequency
//! controller's: a save's stall plus the excess over the baseline of the steps until shortly
//! after it is durable ([`crate::session::FrequencyController::save_costs`]).

use std::collections::BTreeMap;

use serde::Serialize;

/// How a background save takes the model's tensors off the training state (see the module
/// docs). Only meaningful where the tensors are host memory: on a device the model is always
/// staged, since held handles would keep device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStaging {
    /// Copy each tensor out on a helper thread at once and release its handle.
    Stage,
    /// Keep the handles; the writer reads each tensor as it writes it.
    Hold,
}

impl ModelStaging {
    fn other(self) -> Self {
        match self {
            ModelStaging::Stage => ModelStaging::Hold,
            ModelStaging::Hold => ModelStaging::Stage,
        }
    }
}

/// Which [`ModelStaging`] a session's saves use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StagingPolicy {
    /// Whichever loses less training time, measured per save (the default).
    #[default]
    Measured,
    /// Always this one.
    Fixed(ModelStaging),
}

/// One save's staging, and what it cost training as last measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StagingRecord {
    /// The save's step.
    pub step: u64,
    /// The staging it used.
    pub staging: ModelStaging,
    /// Its stall plus the excess of the following steps, in ms (`None`: not measured).
    pub cost_ms: Option<f64>,
    /// Whether its cost counts in the choice (`false` for the warm-up save).
    pub counted: bool,
}

/// A save picked by a [`StagingChooser`]: its way, measured cost in seconds, and whether that
/// cost counts in the choice.
#[derive(Debug, Clone, Copy)]
struct Picked {
    staging: ModelStaging,
    cost: Option<f64>,
    counted: bool,
}

/// Picks each save's [`ModelStaging`] under a [`StagingPolicy`] and keeps what each cost.
#[derive(Debug, Clone, Default)]
pub struct StagingChooser {
    policy: StagingPolicy,
    /// Each save picked here, by step.
    saves: BTreeMap<u64, Picked>,
    /// Picks made under [`StagingPolicy::Measured`] so far, the warm-up included (what
    /// decides the warm-up and the re-probes).
    picks: u64,
}

impl StagingChooser {
    /// Every this many measured picks, the way not in favour is tried once more.
    pub const REPROBE_EVERY: u64 = 8;
    /// Newest measured saves per way whose median cost decides.
    const SAMPLES: usize = 3;
    /// The run's first saves under [`StagingPolicy::Measured`], staged and not counted.
    pub const WARMUP: u64 = 1;
    /// Saves kept for the report.
    const KEPT: usize = 256;

    /// A chooser under `policy`.
    pub fn new(policy: StagingPolicy) -> Self {
        Self {
            policy,
            ..Default::default()
        }
    }

    /// The policy.
    pub fn policy(&self) -> StagingPolicy {
        self.policy
    }

    /// Updates the costs of the saves picked here from `(step, seconds)` pairs (later values
    /// replace earlier ones: a cost is remeasured while the save's window is still recent).
    pub fn observe(&mut self, costs: impl IntoIterator<Item = (u64, f64)>) {
        for (step, cost) in costs {
            if let Some(p) = self.saves.get_mut(&step) {
                p.cost = Some(cost);
            }
        }
    }

    /// The median cost in seconds of the newest measured saves that used `staging`, and how
    /// many were measured in all (warm-up saves left out).
    pub fn measured(&self, staging: ModelStaging) -> (Option<f64>, usize) {
        let mut costs: Vec<f64> = self
            .saves
            .values()
            .filter(|p| p.counted && p.staging == staging)
            .filter_map(|p| p.cost)
            .collect();
        let n = costs.len();
        let mut newest = costs.split_off(n.saturating_sub(Self::SAMPLES));
        newest.sort_by(f64::total_cmp);
        (newest.get(newest.len() / 2).copied(), n)
    }

    fn tried(&self, staging: ModelStaging) -> bool {
        self.saves
            .values()
            .any(|p| p.counted && p.staging == staging)
    }

    /// The staging for the save of `step`, recorded so that its cost can be attributed.
    pub fn pick(&mut self, step: u64) -> ModelStaging {
        let (staging, counted) = match self.policy {
            StagingPolicy::Fixed(s) => (s, true),
            StagingPolicy::Measured if self.picks < Self::WARMUP => {
                self.picks += 1;
                (ModelStaging::Stage, false)
            }
            StagingPolicy::Measured => (self.measured_pick(), true),
        };
        self.saves.insert(
            step,
            Picked {
                staging,
                cost: None,
                counted,
            },
        );
        while self.saves.len() > Self::KEPT {
            self.saves.pop_first();
        }
        staging
    }

    fn measured_pick(&mut self) -> ModelStaging {
        self.picks += 1;
        // Each way once first: staging (the known one), then holding.
        for s in [ModelStaging::Stage, ModelStaging::Hold] {
            if !self.tried(s) {
                return s;
            }
        }
        let (stage, _) = self.measured(ModelStaging::Stage);
        let (hold, _) = self.measured(ModelStaging::Hold);
        let best = match (stage, hold) {
            (Some(s), Some(h)) if h < s => ModelStaging::Hold,
            (Some(_), Some(_)) => ModelStaging::Stage,
            // A way tried but not yet measured (its window is still open, or it had none)
            // is not chosen over one that was.
            (None, Some(_)) => ModelStaging::Hold,
            _ => ModelStaging::Stage,
        };
        if self.picks.is_multiple_of(Self::REPROBE_EVERY) {
            best.other()
        } else {
            best
        }
    }

    /// Every save picked here (the newest 256), oldest first.
    pub fn records(&self) -> Vec<StagingRecord> {
        self.saves
            .iter()
            .map(|(&step, p)| StagingRecord {
                step,
                staging: p.staging,
                cost_ms: p.cost.map(|c| c * 1e3),
                counted: p.counted,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ModelStaging::{Hold, Stage};

    /// Runs `n` saves, one every 10 steps, each costing what `cost` says for its staging.
    fn run(chooser: &mut StagingChooser, n: u64, cost: impl Fn(u64, ModelStaging) -> f64) {
        for i in 1..=n {
            let step = 10 * i;
            let s = chooser.pick(step);
            chooser.observe([(step, cost(step, s))]);
        }
    }

    fn picks(chooser: &StagingChooser) -> Vec<ModelStaging> {
        chooser.records().iter().map(|r| r.staging).collect()
    }

    #[test]
    fn tries_both_then_keeps_the_cheaper_and_reprobes() {
        let mut c = StagingChooser::new(StagingPolicy::Measured);
        run(&mut c, 17, |_, s| if s == Hold { 0.2 } else { 0.5 });
        let p = picks(&c);
        assert_eq!(&p[..4], &[Stage, Stage, Hold, Hold]);
        // A warm-up save, one of each way, then holding; picks 8 and 16 re-probe staging.
        for (i, s) in p.iter().enumerate() {
            let want = if i < 3 {
                [Stage, Stage, Hold][i]
            } else if (i + 1) % 8 == 0 {
                Stage
            } else {
                Hold
            };
            assert_eq!(*s, want, "pick {}", i + 1);
        }
        assert_eq!(c.measured(Hold), (Some(0.2), 13));
        assert!(!c.records()[0].counted && c.records()[1].counted);
    }

    /// The run's first save costs more whichever way it goes (fresh memory); counted, it
    /// would make the way tried first look dearer and the other be kept.
    #[test]
    fn the_warm_up_save_does_not_count() {
        let mut c = StagingChooser::new(StagingPolicy::Measured);
        run(&mut c, 8, |step, s| match (step, s) {
            (10, _) => 5.0,
            (_, Stage) => 0.2,
            (_, Hold) => 0.4,
        });
        let p = picks(&c);
        assert_eq!(&p[..3], &[Stage, Stage, Hold]);
        assert!(p[3..7].iter().all(|s| *s == Stage), "{p:?}");
        assert_eq!(c.measured(Stage), (Some(0.2), 5));
    }

    #[test]
    fn follows_a_change_in_which_is_cheaper() {
        let mut c = StagingChooser::new(StagingPolicy::Measured);
        // Holding is cheaper for the first 60 steps, then staging becomes much cheaper.
        run(&mut c, 40, |step, s| match (step <= 60, s) {
            (true, Hold) | (false, Stage) => 0.1,
            _ => 1.0,
        });
        let p = picks(&c);
        assert_eq!(p[3], Hold);
        assert!(
            p[30..].iter().filter(|s| **s == Stage).count() >= 8,
            "still holding after the change: {p:?}"
        );
    }

    #[test]
    fn an_unmeasured_way_is_not_preferred_and_fixed_policies_are_kept() {
        let mut c = StagingChooser::new(StagingPolicy::Measured);
        assert_eq!(c.pick(10), Stage);
        assert_eq!(c.pick(20), Stage);
        assert_eq!(c.pick(30), Hold);
        // Only staging's cost arrived.
        c.observe([(20, 0.3), (999, 0.0)]);
        assert_eq!(c.pick(40), Stage);
        assert_eq!(c.records()[1].cost_ms, Some(300.0));

        let mut fixed = StagingChooser::new(StagingPolicy::Fixed(Hold));
        run(&mut fixed, 20, |_, s| if s == Hold { 1.0 } else { 0.0 });
        assert!(picks(&fixed).iter().all(|s| *s == Hold));
        assert!(fixed.records().iter().all(|r| r.counted));
    }
}
