//! Typed errors. Every persist error names the step and the file it was working on.

use std::{fmt, io, path::PathBuf};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The stage of the publication protocol an error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Creating the `.tmp-*` directory.
    CreateTmp,
    /// Writing a part's bytes.
    WritePart,
    /// fsync of a part file.
    FsyncPart,
    /// Writing `manifest.json`.
    WriteManifest,
    /// fsync of `manifest.json`.
    FsyncManifest,
    /// fsync of the temporary directory.
    FsyncTmpDir,
    /// Renaming the temporary directory to `step-*`.
    Rename,
    /// fsync of the root after the rename.
    FsyncRoot,
    /// Replacing the `latest` pointer.
    UpdateLatest,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Stage::CreateTmp => "creating the temporary directory",
            Stage::WritePart => "writing a part",
            Stage::FsyncPart => "fsync of a part",
            Stage::WriteManifest => "writing the manifest",
            Stage::FsyncManifest => "fsync of the manifest",
            Stage::FsyncTmpDir => "fsync of the temporary directory",
            Stage::Rename => "renaming into place",
            Stage::FsyncRoot => "fsync of the root directory",
            Stage::UpdateLatest => "updating `latest`",
        };
        f.write_str(s)
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The background (or synchronous) persist of a checkpoint failed; nothing was published.
    #[error("checkpoint at step {step} failed while {stage} ({}): {source}", path.display())]
    Persist {
        /// Step of the failed checkpoint.
        step: u64,
        /// Protocol stage.
        stage: Stage,
        /// File or directory being worked on.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// A part producer failed while writing; nothing was published.
    #[error("checkpoint at step {step} failed: part '{part}' could not be produced: {source}")]
    Producer {
        /// Step of the failed checkpoint.
        step: u64,
        /// Name of the part.
        part: String,
        /// What the producer reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The checkpoint was published, but retention afterwards failed.
    #[error("checkpoint at step {step} was published, but retention failed on {}: {source}", path.display())]
    Retention {
        /// Step that was published.
        step: u64,
        /// Directory being removed.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// A checkpoint for this step is already published.
    #[error("checkpoint at step {step} already exists at {}", path.display())]
    AlreadyPublished {
        /// Step.
        step: u64,
        /// Existing directory.
        path: PathBuf,
    },
    /// Another writer holds the root.
    #[error("checkpoint root {} is locked by another writer ({holder}); only one writer per root is allowed", root.display())]
    Locked {
        /// The root directory.
        root: PathBuf,
        /// What the lock file says about its holder.
        holder: String,
    },
    /// A file failed verification or could not be parsed.
    #[error("{}: {reason}", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A snapshot is malformed (bad part name, duplicate part, ...).
    #[error("invalid snapshot for step {step}: {reason}")]
    InvalidSnapshot {
        /// Step.
        step: u64,
        /// What is wrong.
        reason: String,
    },
    /// Plain I/O error outside a persist (opening the root, listing, reading).
    #[error("{}: {source}", path.display())]
    Io {
        /// Path involved.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The persist thread is gone (it panicked).
    #[error("the checkpoint persist thread stopped unexpectedly: {0}")]
    WorkerGone(String),
}

impl Error {
    /// The step this error is about, if any.
    pub fn step(&self) -> Option<u64> {
        match self {
            Error::Persist { step, .. }
            | Error::Producer { step, .. }
            | Error::Retention { step, .. }
            | Error::AlreadyPublished { step, .. }
            | Error::InvalidSnapshot { step, .. } => Some(*step),
            _ => None,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
