//! Listing a checkpoint root: the `step-*` directories it holds, each with how far it verified
//! and whether `latest` names it, and verifying a whole root that way ([`verify_root`]).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{
    Error, Manifest, Result,
    latest::read_latest,
    naming::{LATEST_FILE, parse_step_dir},
    storage::{Storage, StoragePath},
    verify::{Depth, check_checkpoint},
};

/// A checkpoint directory found in a root.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointInfo {
    /// Step.
    pub step: u64,
    /// Directory.
    pub path: PathBuf,
    /// Parsed manifest, when valid.
    #[serde(skip)]
    pub manifest: Option<Manifest>,
    /// Total bytes of its files, when the manifest is valid.
    pub bytes: u64,
    /// Whether `latest` names it.
    pub latest: bool,
    /// Verification status.
    pub status: CheckpointStatus,
}

/// How far a checkpoint was verified.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "status", content = "reason", rename_all = "snake_case")]
pub enum CheckpointStatus {
    /// Every file exists with the listed size and checksum.
    Verified,
    /// Manifest valid and sizes match; checksums not computed.
    SizesOk,
    /// Missing or corrupt; the reason names the file.
    Invalid(String),
}

/// Lists `step-*` directories in `root`, oldest first. With `full`, every checksum is
/// checked; otherwise only the manifest and file sizes.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage. What `ckpt ls`
/// shows:
///
/// ```no_run
/// for c in ckpt_core::list_checkpoints("runs/x/ckpt", false)? {
///     let mark = if c.latest { " (latest)" } else { "" };
///     println!("step {} {} bytes {:?}{mark}", c.step, c.bytes, c.status);
/// }
/// # Ok::<(), ckpt_core::Error>(())
/// ```
pub fn list_checkpoints<'a>(
    at: impl Into<StoragePath<'a>>,
    full: bool,
) -> Result<Vec<CheckpointInfo>> {
    let StoragePath {
        storage: st,
        path: root,
    } = at.into();
    let latest = read_latest(StoragePath::new(st, root)).ok().flatten();
    let (depth, verified) = if full {
        (Depth::Full, CheckpointStatus::Verified)
    } else {
        (Depth::Sizes, CheckpointStatus::SizesOk)
    };
    let mut out = Vec::new();
    for (step, path) in step_dirs(st, root)? {
        let (manifest, status) = match check_checkpoint(st, &path, depth) {
            Ok(m) => (Some(m), verified.clone()),
            Err(e) => (None, CheckpointStatus::Invalid(e.to_string())),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        out.push(CheckpointInfo {
            step,
            bytes: manifest.as_ref().map(|m| m.total_bytes()).unwrap_or(0),
            manifest,
            latest: latest.as_deref() == Some(name.as_str()),
            path,
            status,
        });
    }
    Ok(out)
}

/// The `step-*` directories in `root` with their steps, oldest first, unverified. A missing
/// root has none.
pub(crate) fn step_dirs(st: &dyn Storage, root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = match st.list(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(root, e)),
    };
    let mut v = Vec::new();
    for ent in entries {
        if let Some(step) = parse_step_dir(&ent.name)
            && ent.is_dir
        {
            v.push((step, root.join(&ent.name)));
        }
    }
    v.sort();
    Ok(v)
}

/// Verifies every checkpoint in `root` and that `latest`, if present, names a valid one (it may
/// be missing or lag behind after a crash; recovery repairs both). Returns the list; the error
/// is the first problem found.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage. What
/// `ckpt verify ROOT` does:
///
/// ```no_run
/// match ckpt_core::verify_root("runs/x/ckpt") {
///     Ok(all) => println!("{} checkpoints verify", all.len()),
///     Err(e) => eprintln!("{e}"), // names the checkpoint, the file and the reason
/// }
/// ```
pub fn verify_root<'a>(at: impl Into<StoragePath<'a>>) -> Result<Vec<CheckpointInfo>> {
    let StoragePath {
        storage: st,
        path: root,
    } = at.into();
    let list = list_checkpoints(StoragePath::new(st, root), true)?;
    if let Some(bad) = list.iter().find_map(|c| match &c.status {
        CheckpointStatus::Invalid(r) => Some((c.path.clone(), r.clone())),
        _ => None,
    }) {
        return Err(Error::corrupt(bad.0, bad.1));
    }
    match read_latest(StoragePath::new(st, root))? {
        Some(name) if !list.iter().any(|c| c.latest) => {
            return Err(Error::corrupt(
                root.join(LATEST_FILE),
                format!("names {name:?}, which is not a published checkpoint"),
            ));
        }
        // No `latest` beside published checkpoints: a crash between the first publish's
        // rename and its `latest` write. Nothing is wrong with the checkpoints, and the next
        // start names the newest valid one (as when `latest` lags behind a newer checkpoint).
        Some(_) | None => {}
    }
    Ok(list)
}
