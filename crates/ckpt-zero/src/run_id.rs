//! The run id: names one training run across its restarts, so a node-local memory tier left
//! by another run (or by this root before it started over) is never read.
//!
//! Rank 0 keeps it in the checkpoint root as `ROOT/.run-id` (16 hex digits). A run that starts
//! fresh writes a new one; a run that resumes keeps the root's (and writes one into a root
//! from before run ids).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Error, Result};

/// File name of the run id in a checkpoint root.
pub const RUN_ID_FILE: &str = ".run-id";

fn io_err(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::RunId {
        path: path.to_path_buf(),
        reason: format!("cannot {what}: {e}"),
    }
}

/// A new id: time, process and root mixed (not a secret; unique in practice).
fn new_id(root: &Path) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let seed = format!("{nanos}:{}:{}", std::process::id(), root.display());
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(seed.as_bytes()))
}

/// Writes a new run id into `root` (durably: a temporary file, fsync, rename, fsync of the
/// root) and returns it.
pub(crate) fn start_new(root: &Path) -> Result<String> {
    let id = new_id(root);
    let tmp: PathBuf = root.join(".tmp-run-id");
    let path = root.join(RUN_ID_FILE);
    (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(id.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(root)?.sync_all()
    })()
    .map_err(|e| io_err(&path, "write the run id", e))?;
    Ok(id)
}

/// The run id of `root`, written first if it has none.
pub(crate) fn read_or_start(root: &Path) -> Result<String> {
    let path = root.join(RUN_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if is_id(s.trim()) => Ok(s.trim().to_string()),
        Ok(s) => Err(Error::RunId {
            path,
            reason: format!(
                "not a run id (16 hex digits): {:?}",
                s.chars().take(40).collect::<String>()
            ),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => start_new(root),
        Err(e) => Err(io_err(&path, "read the run id", e)),
    }
}

fn is_id(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_start_changes_the_id_and_a_resume_keeps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let a = read_or_start(tmp.path()).unwrap();
        assert_eq!(read_or_start(tmp.path()).unwrap(), a);
        let b = start_new(tmp.path()).unwrap();
        assert_ne!(a, b);
        assert_eq!(read_or_start(tmp.path()).unwrap(), b);
        std::fs::write(tmp.path().join(RUN_ID_FILE), "garbage").unwrap();
        let e = read_or_start(tmp.path()).unwrap_err().to_string();
        assert!(e.contains(RUN_ID_FILE), "{e}");
    }
}
