//! Errors of ZeRO-1 training and sharded checkpointing.

use std::path::PathBuf;

use crate::collective::CollectiveError;

/// What went wrong in ckpt-zero.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A collective call failed (timeout, a rank gone, mismatched calls).
    #[error("collective: {0}")]
    Collective(#[from] CollectiveError),
    /// The checkpoint engine or layout failed.
    #[error(transparent)]
    Core(#[from] ckpt_core::Error),
    /// Capture, restore or training failed.
    #[error(transparent)]
    Burn(#[from] ckpt_burn::Error),
    /// An optimizer shard is unreadable or inconsistent.
    #[error("{}: {reason}", file.display())]
    Shard {
        /// The shard (file or rank) at fault.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The run id in a checkpoint root could not be read or written.
    #[error("run id {}: {reason}", path.display())]
    RunId {
        /// The run-id file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The node-local memory tier failed: a part could not be written, read, replicated or
    /// restored (the path names the tier directory or checkpoint at fault).
    #[error("memory tier: {}: {reason}", path.display())]
    Tier {
        /// The tier directory or checkpoint at fault.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A tensor could not be moved between the device and the collective.
    #[error("parameter {param}: {reason}")]
    Tensor {
        /// The parameter id.
        param: u64,
        /// Why.
        reason: String,
    },
    /// A checkpoint was not published because some rank failed.
    #[error("checkpoint at step {step} was not published: {reason}")]
    NotPublished {
        /// The step.
        step: u64,
        /// Which rank failed and how.
        reason: String,
    },
    /// A sharded save failed before the ranks could agree on it (a rank died, a collective
    /// timed out, the checkpoint thread failed): nothing was published for `step`, and the
    /// checkpoint group is out of step, so no later checkpoint can be taken in this run.
    #[error("checkpoint at step {step} was not published and checkpointing cannot go on: {reason}")]
    CheckpointGroupFailed {
        /// The step.
        step: u64,
        /// Which rank failed and how.
        reason: String,
    },
    /// The object-store tier failed on this rank (feature `remote`): the error names the step
    /// and the object key.
    #[cfg(feature = "remote")]
    #[error(transparent)]
    Remote(#[from] ckpt_remote::Error),
    /// A sharded checkpoint was not published to the object store because a rank's part of
    /// the upload failed: no remote manifest was written for `step`. Its local copy is
    /// published.
    #[error("uploading step {step}: not published remotely: {reason}")]
    UploadNotPublished {
        /// The step.
        step: u64,
        /// Which rank failed and how (naming the object key).
        reason: String,
    },
    /// A run that does not resume was started in a root holding checkpoints (another run's,
    /// or this one's from before): refused before any training, so their steps are never
    /// replaced.
    #[error(
        "{} already holds checkpoints of an earlier run (newest {}) and this run does not \
         resume: continue it (ZeroTrainingStrategy::resume_latest(), or the trainer's \
         --resume), or start over (overwrite(true), or --fresh), which moves them aside to \
         .rewound-*, or use another directory",
        root.display(),
        newest.display()
    )]
    UsedRoot {
        /// The checkpoint root.
        root: PathBuf,
        /// Its newest valid checkpoint.
        newest: PathBuf,
    },
    /// Invalid settings.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A rank's thread panicked or vanished.
    #[error("rank {rank} failed: {reason}")]
    Rank {
        /// The rank.
        rank: usize,
        /// Why.
        reason: String,
    },
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

impl ckpt_core::session::SaveFailure for Error {
    fn failed_step(&self) -> Option<u64> {
        match self {
            Error::NotPublished { step, .. }
            | Error::CheckpointGroupFailed { step, .. }
            | Error::UploadNotPublished { step, .. } => Some(*step),
            Error::Core(e) => e.failed_step(),
            #[cfg(feature = "remote")]
            Error::Remote(e) => e.failed_step(),
            _ => None,
        }
    }
    /// A sharded save that was not published (every rank agreed on it, so training can go
    /// on); not a collective failure, after which the ranks are no longer in step.
    fn is_save_failure(&self) -> bool {
        match self {
            Error::NotPublished { .. } | Error::UploadNotPublished { .. } => true,
            Error::Core(e) => e.is_save_failure(),
            #[cfg(feature = "remote")]
            Error::Remote(e) => e.is_save_failure(),
            _ => false,
        }
    }
    /// An upload failing leaves the local checkpoint published.
    fn after_publication(&self) -> bool {
        match self {
            Error::Core(e) => e.after_publication(),
            Error::UploadNotPublished { .. } => true,
            #[cfg(feature = "remote")]
            Error::Remote(e) => e.after_publication(),
            _ => false,
        }
    }
}
