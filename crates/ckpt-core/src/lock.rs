//! One writer per root: an exclusive lock on `ROOT/.lock`, taken through the root's
//! [`Storage`](crate::storage::Storage) (an advisory `flock` on the local disk).
//!
//! The kernel releases a local lock when the holder dies, so a lock left by a killed process is
//! recovered simply by taking it again; the pid written into the file is only for messages.

use std::path::{Path, PathBuf};

use crate::{
    Error, Result,
    layout::LOCK_FILE,
    storage::{LockAttempt, LockGuard, StoragePath},
};

/// Holds the exclusive writer lock of a checkpoint root until dropped.
#[derive(Debug)]
pub struct RootLock {
    _guard: Box<dyn LockGuard>,
    path: PathBuf,
}

impl RootLock {
    /// Takes the lock on `at` (a local path, or a [`StoragePath`] on another storage), creating
    /// the directory if needed, or fails with [`Error::Locked`] naming the holder.
    pub fn acquire<'a>(at: impl Into<StoragePath<'a>>) -> Result<Self> {
        let StoragePath {
            storage,
            path: root,
        } = at.into();
        crate::storage::create_dir_all_durable(storage, root).map_err(|e| Error::io(root, e))?;
        let path = root.join(LOCK_FILE);
        let me = format!("pid {} on {}", std::process::id(), hostname());
        match storage
            .try_lock(&path, &me)
            .map_err(|e| Error::io(&path, e))?
        {
            LockAttempt::Acquired(guard) => Ok(Self {
                _guard: guard,
                path,
            }),
            LockAttempt::HeldBy(holder) => Err(Error::Locked {
                root: root.to_path_buf(),
                holder: if holder.is_empty() {
                    "unknown holder".to_string()
                } else {
                    format!("held by {holder}")
                },
            }),
        }
    }

    /// Path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "this host".into())
}
