//! The `latest` pointer: `ROOT/latest` holds the name of the newest published checkpoint and
//! is only ever replaced atomically (temporary file, fsync, rename, fsync of the root).

use std::{fs, io::Write, path::Path};

use crate::{
    Error, Result,
    failpoints::io_failpoint,
    naming::{LATEST_FILE, TMP_PREFIX, nonce, parse_step_dir},
};

/// Reads `ROOT/latest` (None if absent).
pub fn read_latest(root: &Path) -> Result<Option<String>> {
    let p = root.join(LATEST_FILE);
    match fs::read_to_string(&p) {
        Ok(s) => {
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
pub(crate) fn write_latest(root: &Path, name: &str) -> std::io::Result<()> {
    let tmp = root.join(format!("{TMP_PREFIX}latest-{}", nonce()));
    let res = (|| {
        io_failpoint!(WRITE_LATEST);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(name.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        io_failpoint!(RENAME_LATEST);
        fs::rename(&tmp, root.join(LATEST_FILE))?;
        fsync_dir(root)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Removes `ROOT/latest` durably; absent is fine.
pub(crate) fn remove_latest(root: &Path) -> std::io::Result<()> {
    match fs::remove_file(root.join(LATEST_FILE)) {
        Ok(()) => fsync_dir(root),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes the creations, renames and removals in `dir` durable (fsync of the directory), as
/// every atomic step in the root — this pointer's replacement among them — relies on.
pub(crate) fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}
