//! The checkpoints a rewind moved aside (`ROOT/.rewound-*`): a run that started over, or
//! resumed from an earlier step, keeps its abandoned timeline there for the user. Listing,
//! resume and retention never see them, so `ckpt ls` says how much disk they hold and
//! `ckpt gc --rewound` removes them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ckpt_core::{LocalDisk, Storage, layout::REWOUND_PREFIX};

/// One entry a rewind moved aside.
pub(crate) struct Rewound {
    /// Its path in the root.
    pub(crate) path: PathBuf,
    /// The bytes of every file under it.
    pub(crate) bytes: u64,
}

/// The entries of `root` a rewind moved aside, by name.
pub(crate) fn list(root: &Path) -> Result<Vec<Rewound>> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(root).with_context(|| format!("{}: cannot list", root.display()))?;
    for ent in entries {
        let ent = ent.with_context(|| format!("{}: cannot list", root.display()))?;
        if !ent
            .file_name()
            .to_string_lossy()
            .starts_with(REWOUND_PREFIX)
        {
            continue;
        }
        let path = ent.path();
        let bytes = bytes_under(&path)?;
        out.push(Rewound { path, bytes });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The bytes of the files at or under `path` (links not followed).
fn bytes_under(path: &Path) -> Result<u64> {
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("{}: cannot stat", path.display()))?;
    if !meta.is_dir() {
        return Ok(meta.len());
    }
    let mut total = 0;
    for ent in
        std::fs::read_dir(path).with_context(|| format!("{}: cannot list", path.display()))?
    {
        let ent = ent.with_context(|| format!("{}: cannot list", path.display()))?;
        total += bytes_under(&ent.path())?;
    }
    Ok(total)
}

/// A line saying what `rewound` holds and how to remove it; `None` when it is empty.
pub(crate) fn note(rewound: &[Rewound]) -> Option<String> {
    if rewound.is_empty() {
        return None;
    }
    let bytes = rewound.iter().map(|r| r.bytes).sum();
    Some(format!(
        "note: {} checkpoint(s) a rewind moved aside ({REWOUND_PREFIX}*, {}) are kept; \
         ckpt gc --rewound removes them",
        rewound.len(),
        crate::human(bytes)
    ))
}

/// Removes `rewound` from `root` (call under the root's lock), durably: the root is synced
/// once they are gone. Returns the paths removed.
pub(crate) fn remove(root: &Path, rewound: Vec<Rewound>) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for r in rewound {
        let gone = if r.path.is_dir() {
            std::fs::remove_dir_all(&r.path)
        } else {
            std::fs::remove_file(&r.path)
        };
        gone.with_context(|| format!("{}: cannot remove", r.path.display()))?;
        removed.push(r.path);
    }
    if !removed.is_empty() {
        LocalDisk
            .sync_dir(root)
            .with_context(|| format!("{}: cannot sync", root.display()))?;
    }
    Ok(removed)
}
