//! One writer per root: an exclusive advisory lock (`flock`) on `ROOT/.lock`.
//!
//! The kernel releases the lock when the holder dies, so a lock left by a killed process is
//! recovered simply by taking it again; the pid written into the file is only for messages.

use std::{
    fs::{File, OpenOptions, TryLockError},
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use crate::{Error, LOCK_FILE, Result};

/// Holds the exclusive writer lock of a checkpoint root until dropped.
#[derive(Debug)]
pub struct RootLock {
    _file: File,
    path: PathBuf,
}

impl RootLock {
    /// Takes the lock on `root` (creating the directory if needed) or fails with
    /// [`Error::Locked`] naming the holder.
    pub fn acquire(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
        let path = root.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    "unknown holder".to_string()
                } else {
                    format!("held by {holder}")
                };
                return Err(Error::Locked {
                    root: root.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(Error::io(&path, e)),
        }
        let me = format!("pid {} on {}", std::process::id(), hostname());
        let _ = file.set_len(0);
        let _ = file.seek(SeekFrom::Start(0));
        let _ = file.write_all(me.as_bytes());
        Ok(Self { _file: file, path })
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
