//! What a session's saves cost and did, for the run's report: each save, each failure, the
//! stop, and the training time checkpoints lost.

use serde::Serialize;

/// One checkpoint in the report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SaveRecord {
    /// Step.
    pub step: u64,
    /// Time the training thread was blocked by this save.
    pub stall_ms: f64,
    /// Time writing and publishing took (`null` where the target reports none).
    pub persist_ms: Option<f64>,
    /// Bytes written.
    pub bytes: u64,
    /// Part of `stall_ms` spent waiting for a free persist slot (backpressure `block`).
    pub blocked_ms: f64,
}

/// A checkpoint that failed to persist (kept going under [`SaveErrorPolicy::Continue`](crate::SaveErrorPolicy::Continue)).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailedSave {
    /// Step of the failed checkpoint.
    pub step: Option<u64>,
    /// The error, naming the step, the protocol stage and the file.
    pub error: String,
}

/// How a stopped run ended.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopOutcome {
    /// The checkpoint of the stop step (and every earlier one) is durable and published.
    Saved,
    /// The grace period ran out before the final checkpoint was durable; the checkpoints
    /// published before it are intact.
    GraceExpired,
    /// Checkpointing is off: nothing was saved.
    NotSaved,
}

/// Why and where a run stopped before its last step (a stop request, e.g. SIGTERM).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StopReport {
    /// Step boundary the run stopped at (its checkpoint is the final one).
    pub step: u64,
    /// Whether the final checkpoint was made durable in time.
    pub outcome: StopOutcome,
    /// Time spent waiting for in-flight checkpoints after the stop.
    pub wait_ms: f64,
}

/// What a session did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionReport {
    /// Published checkpoints, by step.
    pub saves: Vec<SaveRecord>,
    /// Checkpoints dropped because the pipeline was full (backpressure `skip`).
    pub skipped: u64,
    /// Steps saved while training waited for the whole save ([`SaveRoute::Blocking`](crate::SaveRoute::Blocking)).
    pub blocking_saves: Vec<u64>,
    /// Steps whose save would have exceeded the memory budget in the background: training
    /// waited until what they still held fit ([`SaveRoute::Throttled`](crate::SaveRoute::Throttled)).
    pub throttled_saves: Vec<u64>,
    /// Checkpoints that failed (only under [`SaveErrorPolicy::Continue`](crate::SaveErrorPolicy::Continue)).
    pub failed_saves: Vec<FailedSave>,
    /// Total time saves waited for a free persist slot.
    pub blocked_ms: f64,
    /// Most checkpoints seen persisting at once.
    pub max_in_flight_seen: usize,
    /// Save interval in steps in force at the end.
    pub interval: Option<u64>,
    /// Set when a stop request ended the run early.
    pub stopped: Option<StopReport>,
    /// The training time checkpoints cost, as measured.
    pub lost: LostTime,
}

/// The training time checkpoints cost a run, as the frequency controller measured it (for
/// every frequency policy): the stall of each save plus the excess over the baseline step
/// time of every following step until shortly after the save is durable, and the wait at the
/// end for saves still in flight, which have no training left to overlap with.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LostTime {
    /// The baseline: the lower quartile of the step times outside any save's window, in ms
    /// (`None`: every step was inside one, so only stalls are counted).
    pub baseline_step_ms: Option<f64>,
    /// How many steps the baseline comes from. A handful of early steps (a short run whose
    /// saves overlap most steps) makes it too high, because warm-up steps are slow: then
    /// `during_training_ms` undercounts and a run without checkpoints is the better reference.
    pub baseline_steps: usize,
    /// Stalls plus the steps' excess over the baseline, in ms.
    pub during_training_ms: f64,
    /// The wait in `finish` for the saves still in flight, in ms.
    pub final_wait_ms: f64,
    /// `during_training_ms + final_wait_ms`.
    pub total_ms: f64,
    /// `total_ms` over the checkpoints published.
    pub per_save_ms: Option<f64>,
}
