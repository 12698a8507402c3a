//! Errors of the object-store tier. Each names the step and the object key (or the local file)
//! it concerns; credentials never appear in them (the store's URL is shown without them).

use std::path::PathBuf;

/// An error of the object-store tier.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not one this tier can open.
    #[error("{url}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A request to the object store failed while uploading a checkpoint. Nothing of this step
    /// was published: its manifest was not written.
    #[error("uploading step {step}: {key}: {source}")]
    Upload {
        /// The step being uploaded.
        step: u64,
        /// The object key the request was for.
        key: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A request to the object store failed outside an upload (listing, reading, deleting).
    #[error("{key}: {source}")]
    Store {
        /// The object key (or prefix) the request was for.
        key: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// Another writer moved `latest` between our read and our conditional write: exactly one
    /// writer wins, and this one lost. The checkpoint it uploaded stays, unnamed by `latest`.
    #[error(
        "step {step}: {key} was changed by another writer (it now names {current:?}); \
         two runs are uploading to the same prefix, give each its own"
    )]
    LostRace {
        /// The step this writer tried to name.
        step: u64,
        /// The key of the pointer.
        key: String,
        /// What the pointer names now, when it could be read.
        current: Option<String>,
    },
    /// A remote object is missing, of the wrong size or checksum, or unreadable as a manifest.
    #[error("{key}: {reason}")]
    Corrupt {
        /// The object key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A local file of the checkpoint being uploaded could not be read, or changed under us.
    #[error("uploading step {step}: {path}: {source}")]
    Local {
        /// The step being uploaded.
        step: u64,
        /// The local file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An error of the local checkpoint engine (reading a manifest, publishing a download).
    #[error(transparent)]
    Core(#[from] ckpt_core::Error),
    /// The uploader's background thread is gone.
    #[error("the uploader thread stopped unexpectedly: {0}")]
    Gone(String),
}

impl ckpt_core::session::SaveFailure for Error {
    fn failed_step(&self) -> Option<u64> {
        match self {
            Error::Upload { step, .. }
            | Error::LostRace { step, .. }
            | Error::Local { step, .. } => Some(*step),
            Error::Core(e) => e.failed_step(),
            _ => None,
        }
    }
    /// An upload failing is one checkpoint's remote copy failing: training can go on.
    fn is_save_failure(&self) -> bool {
        matches!(
            self,
            Error::Upload { .. } | Error::LostRace { .. } | Error::Local { .. }
        )
    }
    /// The local checkpoint was published; only its upload failed.
    fn after_publication(&self) -> bool {
        self.is_save_failure()
    }
}

/// Result of the object-store tier.
pub type Result<T, E = Error> = std::result::Result<T, E>;
