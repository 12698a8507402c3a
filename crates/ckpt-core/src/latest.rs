//! The `latest` pointer: `ROOT/latest` holds the name of the newest published checkpoint and
//! is only ever replaced atomically (temporary file, fsync, rename, fsync of the root).

use std::{io::Write, path::Path};

use crate::{
    Error, Result,
    failpoints::{durability_step, io_failpoint},
    naming::{LATEST_FILE, TMP_PREFIX, nonce, parse_step_dir},
    storage::{Storage, StoragePath},
};

/// Reads `ROOT/latest` (None if absent). A pointer that names no checkpoint directory (empty,
/// garbled) is [`Error::Corrupt`].
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage.
pub fn read_latest<'a>(at: impl Into<StoragePath<'a>>) -> Result<Option<String>> {
    let StoragePath {
        storage,
        path: root,
    } = at.into();
    let p = root.join(LATEST_FILE);
    match storage.read(&p) {
        Ok(bytes) => {
            let s = String::from_utf8_lossy(&bytes);
            let name = s.trim().to_string();
            if parse_step_dir(&name).is_none() {
                return Err(Error::corrupt(
                    &p,
                    format!("does not name a checkpoint directory: {name:?}"),
                ));
            }
            Ok(Some(name))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&p, e)),
    }
}

/// Atomically replaces `ROOT/latest` with `name` (tmp + fsync + rename + fsync dir).
pub(crate) fn write_latest(storage: &dyn Storage, root: &Path, name: &str) -> std::io::Result<()> {
    let tmp = root.join(format!("{TMP_PREFIX}latest-{}", nonce()));
    let res = (|| {
        io_failpoint!(WRITE_LATEST);
        let mut f = storage.create_file(&tmp)?;
        f.write_all(name.as_bytes())?;
        f.write_all(b"\n")?;
        durability_step!(FSYNC_LATEST_FILE, f.sync())?;
        drop(f);
        io_failpoint!(RENAME_LATEST);
        storage.rename(&tmp, &root.join(LATEST_FILE))?;
        durability_step!(FSYNC_ROOT_LATEST, storage.sync_dir(root))
    })();
    if res.is_err() {
        let _ = storage.remove_file(&tmp);
    }
    res
}

/// Removes `ROOT/latest` durably; absent is fine.
pub(crate) fn remove_latest(storage: &dyn Storage, root: &Path) -> std::io::Result<()> {
    match storage.remove_file(&root.join(LATEST_FILE)) {
        Ok(()) => storage.sync_dir(root),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
