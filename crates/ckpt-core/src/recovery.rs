//! Start-up recovery and garbage collection: removing what a crash left in flight, falling back
//! past invalid checkpoints (moved aside, not deleted), and making `latest` name the newest
//! valid one; [`garbage_collect`] also deletes what recovery moved aside.

use std::path::PathBuf;

use serde::Serialize;

use crate::{
    Error, Result,
    latest::{read_latest, remove_latest, write_latest},
    listing::{CheckpointInfo, CheckpointStatus, step_dirs},
    naming::{
        LATEST_FILE, QUARANTINE_PREFIX, TMP_PREFIX, checkpoint_dir_name, nonce, parse_step_dir,
    },
    storage::StoragePath,
    verify::{Depth, check_checkpoint},
};

/// What start-up recovery found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryReport {
    /// Stale `.tmp-*` entries that were removed.
    pub removed_tmp: Vec<PathBuf>,
    /// Invalid `step-*` directories newer than the newest valid one, moved aside to
    /// `.invalid-*` (with the reason), so their step can be written again.
    pub quarantined: Vec<(PathBuf, String)>,
    /// The newest valid checkpoint, if any.
    pub latest: Option<CheckpointInfo>,
    /// True when `latest` had to be repaired (it named something else or was missing).
    pub repaired_latest: bool,
}

impl RecoveryReport {
    /// True when recovery fell back past an invalid checkpoint.
    pub fn fell_back(&self) -> bool {
        !self.quarantined.is_empty()
    }
}

/// Start-up recovery of a root. Must run under the writer lock: removes stale `.tmp-*`,
/// finds the newest checkpoint that fully verifies, moves newer invalid ones aside (warning for
/// each), and makes `latest` name the newest valid checkpoint.
///
/// What it changes is durable when it returns.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage.
///
/// ```no_run
/// use std::path::Path;
/// let root = Path::new("runs/x/ckpt");
/// let _lock = ckpt_core::RootLock::acquire(root)?; // fails while a trainer holds the root
/// let report = ckpt_core::recover(root)?;
/// for (dir, why) in &report.quarantined {
///     eprintln!("moved aside {}: {why}", dir.display());
/// }
/// # Ok::<(), ckpt_core::Error>(())
/// ```
pub fn recover<'a>(at: impl Into<StoragePath<'a>>) -> Result<RecoveryReport> {
    let StoragePath {
        storage: st,
        path: root,
    } = at.into();
    let mut report = RecoveryReport::default();
    crate::storage::create_dir_all_durable(st, root).map_err(|e| Error::io(root, e))?;
    for ent in st.list(root).map_err(|e| Error::io(root, e))? {
        if ent.name.starts_with(TMP_PREFIX) {
            let p = root.join(&ent.name);
            let r = if ent.is_dir {
                st.remove_dir_all(&p)
            } else {
                st.remove_file(&p)
            };
            r.map_err(|e| Error::io(&p, e))?;
            tracing::warn!(
                path = %p.display(),
                "removed unfinished checkpoint data left by an earlier run (never published)"
            );
            report.removed_tmp.push(p);
        }
    }
    // A rewind a crash interrupted is completed first: the abandoned timeline never returns.
    crate::rewind::complete_interrupted(st, root)?;
    let dirs = step_dirs(st, root)?;
    for (step, path) in dirs.into_iter().rev() {
        match check_checkpoint(st, &path, Depth::Full) {
            Ok(m) => {
                report.latest = Some(CheckpointInfo {
                    step,
                    bytes: m.total_bytes(),
                    manifest: Some(m),
                    latest: true,
                    path,
                    status: CheckpointStatus::Verified,
                });
                break;
            }
            Err(e) => {
                let reason = e.to_string();
                let aside = root.join(format!(
                    "{QUARANTINE_PREFIX}{}-{}",
                    checkpoint_dir_name(step),
                    nonce()
                ));
                st.rename(&path, &aside).map_err(|e| Error::io(&path, e))?;
                tracing::warn!(checkpoint = %path.display(), %reason, moved_to = %aside.display(),
                    "checkpoint is invalid; falling back to an older one");
                report.quarantined.push((path, reason));
            }
        }
    }
    let current = read_latest(StoragePath::new(st, root)).ok().flatten();
    let want = report.latest.as_ref().map(|c| checkpoint_dir_name(c.step));
    if current != want {
        report.repaired_latest = true;
        match &want {
            Some(name) => {
                write_latest(st, root, name).map_err(|e| Error::io(root.join(LATEST_FILE), e))?
            }
            None => remove_latest(st, root).map_err(|e| Error::io(root.join(LATEST_FILE), e))?,
        }
    }
    st.sync_dir(root).map_err(|e| Error::io(root, e))?;
    Ok(report)
}

/// Removes stale `.tmp-*` and quarantined `.invalid-*` entries and invalid `step-*`
/// directories of a root (the caller holds the lock). Returns what was removed.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage. What `ckpt gc`
/// does:
///
/// ```no_run
/// use std::path::Path;
/// let root = Path::new("runs/x/ckpt");
/// let _lock = ckpt_core::RootLock::acquire(root)?;
/// for removed in ckpt_core::garbage_collect(root)? {
///     println!("removed {}", removed.display());
/// }
/// # Ok::<(), ckpt_core::Error>(())
/// ```
pub fn garbage_collect<'a>(at: impl Into<StoragePath<'a>>) -> Result<Vec<PathBuf>> {
    let StoragePath {
        storage: st,
        path: root,
    } = at.into();
    let mut removed = recover(StoragePath::new(st, root))?.removed_tmp;
    for ent in st.list(root).map_err(|e| Error::io(root, e))? {
        let p = root.join(&ent.name);
        let invalid_step =
            parse_step_dir(&ent.name).is_some() && check_checkpoint(st, &p, Depth::Full).is_err();
        if ent.name.starts_with(QUARANTINE_PREFIX) || invalid_step {
            st.remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
            removed.push(p);
        }
    }
    if !removed.is_empty() {
        st.sync_dir(root).map_err(|e| Error::io(root, e))?;
    }
    Ok(removed)
}
