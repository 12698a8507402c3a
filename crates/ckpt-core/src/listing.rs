//! Listing a checkpoint root: the `step-*` directories it holds, each with how far it verified
//! and whether `latest` names it.

use std::{
    fs,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{
    Error, Manifest, Result,
    latest::read_latest,
    naming::parse_step_dir,
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

/// Lists `step-*` directories in `root`, oldest first. With `full`, every checksum is checked;
/// otherwise only the manifest and file sizes.
pub fn list_checkpoints(root: &Path, full: bool) -> Result<Vec<CheckpointInfo>> {
    let latest = read_latest(root).ok().flatten();
    let (depth, verified) = if full {
        (Depth::Full, CheckpointStatus::Verified)
    } else {
        (Depth::Sizes, CheckpointStatus::SizesOk)
    };
    let mut out = Vec::new();
    for (step, path) in step_dirs(root)? {
        let (manifest, status) = match check_checkpoint(&path, depth) {
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
pub(crate) fn step_dirs(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let rd = match fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(root, e)),
    };
    let mut v = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| Error::io(root, e))?;
        if let Some(step) = ent.file_name().to_str().and_then(parse_step_dir)
            && ent.file_type().map(|t| t.is_dir()).unwrap_or(false)
        {
            v.push((step, ent.path()));
        }
    }
    v.sort();
    Ok(v)
}
