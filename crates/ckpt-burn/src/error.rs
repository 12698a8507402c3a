//! Typed errors of the Burn integration. Every error about a file names that file.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while capturing, restoring or training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error from the checkpoint engine (persist, layout, verification).
    #[error(transparent)]
    Core(#[from] ckpt_core::Error),
    /// A burnpack record (model, optimizer, scheduler) could not be encoded or decoded.
    #[error("{}: {reason}", path.display())]
    Record {
        /// The file involved (or the part name when encoding).
        path: PathBuf,
        /// What Burn reported.
        reason: String,
    },
    /// The model in a checkpoint does not fit the model being restored (wrong shapes, missing
    /// or extra tensors). The detail names the tensor path and both shapes.
    #[error("{}: model does not match the checkpoint: {detail}", path.display())]
    ModelMismatch {
        /// The model file.
        path: PathBuf,
        /// Burn's description, naming tensor paths and shapes.
        detail: String,
    },
    /// `trainer.bin` was written by a newer version of this crate.
    #[error(
        "{}: trainer state format version {found} is newer than the supported version {supported}",
        path.display()
    )]
    NewerTrainerState {
        /// The file.
        path: PathBuf,
        /// Version found in the file.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// `trainer.bin` could not be decoded.
    #[error("{}: cannot decode trainer state: {reason}", path.display())]
    TrainerState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A run that does not resume was about to write into a root that holds checkpoints of an
    /// earlier run. Refused, so the old run's steps are never replaced silently.
    #[error(
        "{} already holds checkpoints of an earlier run (newest step-{newest:08}) and this run \
         does not resume from one: to continue that run, resume it \
         (CkptTrainingStrategy::resume_latest(), SupervisedTraining::checkpoint({newest}), \
         or CheckpointManager::resume); to start over, use overwrite(true) \
         (CkptCheckpointers or ManagerConfig), which moves them aside to .rewound-*, or \
         another directory",
        root.display()
    )]
    UsedRoot {
        /// The checkpoint root.
        root: PathBuf,
        /// Its newest valid checkpoint.
        newest: u64,
    },
    /// The last checkpoint was not durable within the grace period
    /// (`CkptCheckpointers::finish_within`); the checkpoints published before it are intact.
    #[error(
        "{}: the last checkpoint was not durable within the grace period of {grace:?}; the \
         checkpoints published before it are intact",
        root.display()
    )]
    GraceExpired {
        /// The checkpoint root.
        root: PathBuf,
        /// The grace period.
        grace: std::time::Duration,
    },
    /// There is no checkpoint to restore from.
    #[error("{}: no valid checkpoint found", root.display())]
    NoCheckpoint {
        /// The root searched.
        root: PathBuf,
    },
    /// The data loader failed to produce a batch.
    #[error("data loader failed at epoch {epoch}, position {position}: {reason}")]
    Data {
        /// Epoch.
        epoch: u64,
        /// Item position in the epoch.
        position: u64,
        /// What the dataset reported.
        reason: String,
    },
    /// An invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An I/O error outside the checkpoint engine (reports, Burn's own checkpointer).
    #[error("{}: {source}", path.display())]
    Io {
        /// The path involved.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The object-store tier failed (an upload, a remote restore).
    #[cfg(feature = "remote")]
    #[error(transparent)]
    Remote(#[from] ckpt_remote::Error),
}

impl Error {
    /// The checkpoint error inside, if this is one.
    fn save_failure(&self) -> Option<&dyn ckpt_core::session::SaveFailure> {
        match self {
            Error::Core(e) => Some(e),
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
