//! `ckpt-demo`: what burn-ckpt's examples, end-to-end tests and benchmarks run, kept out of
//! the library crates (not published, not meant as an API):
//!
//! - [`model`]: the demo MLP with dropout, its synthetic dataset, AdamW and a cosine schedule;
//! - [`trainer`]: the example trainer's single-device loop (`cargo run --example train`);
//! - [`zero`]: the same trainer on N ZeRO-1 ranks (threads, or MPI processes);
//! - [`perf`]: the measurement kernels of the criterion benches and the performance report.
//!
//! Every checkpoint decision in both loops is a [`ckpt_core::CheckpointSession`]'s.

mod baseline;
pub mod model;
pub mod perf;
mod tier;
pub mod trainer;
pub mod zero;

pub use ckpt_burn::UploadRecord;
/// The object-store tier the trainer's `--upload-to` uses (feature `remote`).
#[cfg(feature = "remote")]
pub use ckpt_remote as remote;
pub use model::{
    Backend, Batch, INPUT_DIM, Mlp, SCHEDULE_ITERS, Sample, SampleBatcher, optimizer, scheduler,
    synthetic_dataset,
};
pub use trainer::{
    DemoConfig, DemoReport, FailedSave, Frequency, PinnedSample, SaveErrorPolicy, SaveMode,
    SaveRecord, StepInfo, StopOutcome, StopReport, data_loader, engine_config, fresh_model,
    manager_config, run,
};

/// What can go wrong in a demo run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint engine or layout failed.
    #[error(transparent)]
    Core(#[from] ckpt_core::Error),
    /// Capture, restore or Burn failed.
    #[error(transparent)]
    Burn(#[from] ckpt_burn::Error),
    /// ZeRO-1 training or a sharded save failed.
    #[error(transparent)]
    Zero(#[from] ckpt_zero::Error),
    /// A collective call of the run loop failed.
    #[error("collective: {0}")]
    Collective(#[from] ckpt_zero::collective::CollectiveError),
    /// Invalid settings.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The object-store tier failed (an upload, a remote restore).
    #[cfg(feature = "remote")]
    #[error(transparent)]
    Remote(#[from] ckpt_remote::Error),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The checkpoint error inside, if this is one.
    fn save_failure(&self) -> Option<&dyn ckpt_core::session::SaveFailure> {
        match self {
            Error::Core(e) => Some(e),
            Error::Burn(e) => Some(e),
            Error::Zero(e) => Some(e),
            #[cfg(feature = "remote")]
            Error::Remote(e) => Some(e),
            _ => None,
        }
    }
}

impl ckpt_core::session::SaveFailure for Error {
    fn failed_step(&self) -> Option<u64> {
        self.save_failure().and_then(|e| e.failed_step())
    }
    fn is_save_failure(&self) -> bool {
        self.save_failure().is_some_and(|e| e.is_save_failure())
    }
    fn after_publication(&self) -> bool {
        self.save_failure().is_some_and(|e| e.after_publication())
    }
}
