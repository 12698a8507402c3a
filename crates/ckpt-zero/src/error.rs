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
