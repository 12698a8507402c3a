//! Where a session's checkpoints go ([`SaveTarget`]) and how an error relates to them
//! ([`SaveFailure`]), so the save-error policy can tell a failed save from a failed run.

use std::time::Duration;

use crate::{Engine, Error, SaveEvent};

/// How an error that reached the session relates to checkpoints, so the
/// [`SaveErrorPolicy`](crate::SaveErrorPolicy) can tell a failed save from a failed run.
pub trait SaveFailure: std::error::Error {
    /// The step of the checkpoint the error is about, if any.
    fn failed_step(&self) -> Option<u64>;
    /// Whether this is one checkpoint failing (training itself can go on).
    fn is_save_failure(&self) -> bool;
    /// Whether the checkpoint was published and only the work after it failed (retention).
    fn after_publication(&self) -> bool {
        false
    }
}

impl SaveFailure for Error {
    fn failed_step(&self) -> Option<u64> {
        self.step()
    }
    fn is_save_failure(&self) -> bool {
        matches!(
            self,
            Error::Persist { .. } | Error::Producer { .. } | Error::Retention { .. }
        )
    }
    fn after_publication(&self) -> bool {
        matches!(self, Error::Retention { .. })
    }
}

/// Where a session's checkpoints go: something that persists submitted saves in the
/// background and reports them once durable. Submitting is the capture closure's business
/// (see [`CheckpointSession::save`](crate::CheckpointSession::save)), so the target only reports.
pub trait SaveTarget {
    /// The errors it returns.
    type Error: SaveFailure;
    /// Checkpoints submitted and not yet reported.
    fn in_flight(&self) -> usize;
    /// Checkpoints published since the last call (non-blocking); a background failure once.
    fn poll(&mut self) -> Result<Vec<SaveEvent>, Self::Error>;
    /// Waits until nothing is in flight; the published checkpoints, or the first failure.
    fn wait_idle(&mut self) -> Result<Vec<SaveEvent>, Self::Error>;
    /// Total time submits waited for a free persist slot.
    fn blocked_total(&self) -> Duration {
        Duration::ZERO
    }
    /// Bytes the saves in flight still hold, when the target counts them
    /// ([`Engine::held_bytes`]); `None` otherwise (the gate then assumes each save in flight
    /// holds all it declared). Required, so a wrapper cannot silently lose the count.
    fn held_bytes(&self) -> Option<u64>;
    /// Waits until the saves in flight hold at most `limit` bytes; `false` when the target
    /// cannot tell (the session then waits for the saves to be durable instead, and says so).
    fn wait_held_at_most(&mut self, limit: u64) -> Result<bool, Self::Error>;
}

impl SaveTarget for Engine {
    type Error = Error;
    fn in_flight(&self) -> usize {
        Engine::in_flight(self)
    }
    fn poll(&mut self) -> Result<Vec<SaveEvent>, Error> {
        Engine::poll(self)
    }
    fn wait_idle(&mut self) -> Result<Vec<SaveEvent>, Error> {
        Engine::wait_idle(self)
    }
    fn blocked_total(&self) -> Duration {
        self.metrics().blocked_total
    }
    fn held_bytes(&self) -> Option<u64> {
        Some(Engine::held_bytes(self))
    }
    fn wait_held_at_most(&mut self, limit: u64) -> Result<bool, Error> {
        Engine::wait_held_at_most(self, limit).map(|_| true)
    }
}
