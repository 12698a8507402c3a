//! The memory budget of a session's saves ([`MemoryGate`]): which route a save takes
//! (background, throttled or blocking) for what it needs in memory, and what a capture did
//! ([`Submitted`]).

use std::time::Duration;

use serde::Serialize;

use crate::engine::SubmitOutcome;

/// Whether a save runs in the background or while training waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveRoute {
    /// Submitted, and training continues while it persists.
    Background,
    /// Submitted, then waited for before training continues (the same bytes).
    Blocking,
    /// Submitted to the background, then training waited only until what the save still
    /// holds fit the memory budget, or what the save cannot do without
    /// ([`SaveMemory::blocking`]) where that is more (the rest persists while training goes
    /// on).
    Throttled,
}

/// Peak extra memory of one save, in bytes, by route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveMemory {
    /// Held when training continues while the save persists (staged copies of the state, or
    /// held handles that an update copies on write, until written).
    pub background: u64,
    /// Held while the trainer waits (nothing is copied on write then): the least any route
    /// holds, such as a record the save must materialize whole. A throttled save waits until
    /// what is held fits the larger of the budget (less [`Self::transient`]) and this.
    pub blocking: u64,
    /// Needed only for a moment beside what is held, by the save's own encoding, whatever the
    /// route: waiting cannot avoid it. With Burn 0.22.1, `OptimizerRecord::into_bytes` copies
    /// the encoded record into a second buffer of its size before the first is freed. Part of
    /// the save's peak, so the budget leaves room for it.
    pub transient: u64,
}

/// Routes saves by a memory budget: a save goes to the background when its peak (what it
/// holds plus its encoding's [`SaveMemory::transient`]), plus what the saves still in flight
/// hold, fits; otherwise it is [`SaveRoute::Throttled`](crate::SaveRoute::Throttled): still persisted in the background,
/// but training waits after the submit until what is held leaves room for the transient
/// within the budget (about the time to persist the excess). The first such save is a
/// warning.
#[derive(Debug, Clone, Default)]
pub struct MemoryGate {
    pub(crate) budget: Option<u64>,
    pub(crate) in_flight: usize,
    pub(crate) held_now: Option<u64>,
    pub(crate) held_per_save: u64,
    pub(crate) previous_bytes: Option<u64>,
    pub(crate) fallbacks: u64,
    pub(crate) wait_limit: Option<u64>,
}

impl MemoryGate {
    /// A gate for a budget of `budget` bytes (`None`: no limit), nothing in flight.
    pub fn new(budget: Option<u64>) -> Self {
        Self {
            budget,
            ..Default::default()
        }
    }

    /// The budget in bytes (`None`: no limit).
    pub fn budget(&self) -> Option<u64> {
        self.budget
    }

    /// Bytes written by the newest published checkpoint (to size the next one's parts).
    pub fn previous_bytes(&self) -> Option<u64> {
        self.previous_bytes
    }

    /// What the newest throttled save waits for: until the bytes held fit this (the budget,
    /// or the save's own floor, [`SaveMemory::blocking`], where that is more). `None` when
    /// the newest route was not throttled.
    pub fn wait_limit(&self) -> Option<u64> {
        self.wait_limit
    }

    /// The route that keeps the save of `step`, needing `need`, within the budget.
    pub fn route(&mut self, need: SaveMemory, step: u64) -> SaveRoute {
        self.wait_limit = None;
        let Some(budget) = self.budget else {
            return SaveRoute::Background;
        };
        let held = self
            .held_now
            .unwrap_or(self.in_flight as u64 * self.held_per_save);
        self.held_per_save = need.background;
        let peak = held
            .saturating_add(need.background)
            .saturating_add(need.transient);
        if peak <= budget {
            return SaveRoute::Background;
        }
        self.fallbacks += 1;
        // Until what is held leaves room for the encoding's transient copy; but waiting longer
        // than until the save holds only what it cannot do without would keep training idle
        // without saving memory.
        self.wait_limit = Some(budget.saturating_sub(need.transient).max(need.blocking));
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        // Said once; the report lists every such save, and the session sums them up.
        if self.fallbacks == 1 {
            tracing::warn!(
                step,
                "a background save would hold {:.0} MiB and need {:.0} MiB more for a moment \
                 while it encodes (plus {:.0} MiB held by saves in flight), over the snapshot \
                 memory budget of {:.0} MiB: after submitting it, training waits until what it \
                 still holds leaves room for that within the budget (or the save's own floor, \
                 where that is more)",
                mib(need.background),
                mib(need.transient),
                mib(held),
                mib(budget)
            );
            // Waiting stops training from copying what the save holds, not the save's own
            // encoding buffers: a budget below them is exceeded whatever training does.
            let floor = need.blocking.saturating_add(need.transient);
            if floor > budget {
                tracing::warn!(
                    step,
                    "even with training waiting, encoding this save takes about {:.0} MiB at \
                     its peak by its own estimate (with Burn 0.22.1: the optimizer record is \
                     materialized whole, and its encoding copies it once more), more than the \
                     snapshot memory budget of {:.0} MiB: the budget will be exceeded by about \
                     {:.0} MiB during each such save, and training waits only until the save \
                     holds no more than it needs",
                    mib(floor),
                    mib(budget),
                    mib(floor - budget)
                );
            }
        }
        SaveRoute::Throttled
    }
}

/// What a capture closure did with the state (see [`CheckpointSession::save`](crate::CheckpointSession::save)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// What the target did with the submitted checkpoint.
    pub outcome: SubmitOutcome,
    /// The route it was submitted on; [`SaveRoute::Blocking`](crate::SaveRoute::Blocking) makes the session wait for it.
    pub route: SaveRoute,
}

impl Submitted {
    /// Handed to a background persist (in the background route) after waiting `blocked` for
    /// a slot: what a capture that submits to a sharded saver or Burn's checkpointer returns.
    pub fn queued(step: u64, blocked: Duration) -> Self {
        Self {
            outcome: SubmitOutcome::Queued { step, blocked },
            route: SaveRoute::Background,
        }
    }
}
