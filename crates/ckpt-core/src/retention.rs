//! Retention: which published checkpoints to keep ([`Retention`]), applied after every
//! publication and on demand ([`prune`]).

use std::path::Path;

use crate::{
    Error, Result,
    failpoints::{durability_step, io_failpoint},
    latest::read_latest,
    listing::step_dirs,
    naming::{TMP_PREFIX, checkpoint_dir_name, nonce, parse_step_dir},
    storage::{Storage, StoragePath},
    verify::{Depth, check_checkpoint},
};

/// Which published checkpoints to keep. Retention runs only after a publication and never
/// removes the newest valid checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep the newest N (None: keep all).
    pub keep_last: Option<usize>,
    /// Also keep every checkpoint whose step is a multiple of K.
    pub keep_every: Option<u64>,
}

impl Retention {
    /// Keep everything.
    pub fn keep_all() -> Self {
        Self::default()
    }

    /// Keep the newest `n` (at least 1).
    pub fn keep_last(n: usize) -> Self {
        Self {
            keep_last: Some(n.max(1)),
            keep_every: None,
        }
    }

    /// Also keep steps that are multiples of `k`.
    pub fn with_keep_every(mut self, k: u64) -> Self {
        self.keep_every = (k > 0).then_some(k);
        self
    }

    /// Steps to delete among `valid` (ascending).
    pub fn to_delete(&self, valid: &[u64]) -> Vec<u64> {
        let Some(n) = self.keep_last else {
            return Vec::new();
        };
        let n = n.max(1);
        let cut = valid.len().saturating_sub(n);
        valid[..cut]
            .iter()
            .copied()
            .filter(|s| self.keep_every.is_none_or(|k| !s.is_multiple_of(k)))
            .collect()
    }
}

/// Applies retention: removes old valid checkpoints the policy does not keep. Only checkpoints
/// older than the one `latest` names are candidates. Each is renamed to `.tmp-*` first, so a
/// crash midway never leaves a half-deleted `step-*` directory. `step` is the publication that
/// triggered it, named in errors.
pub(crate) fn apply_retention(
    st: &dyn Storage,
    root: &Path,
    policy: &Retention,
    step: u64,
) -> Result<Vec<u64>> {
    let latest_step = read_latest(StoragePath::new(st, root))
        .ok()
        .flatten()
        .and_then(|n| parse_step_dir(&n));
    let valid: Vec<u64> = step_dirs(st, root)?
        .into_iter()
        .filter(|(s, p)| Some(*s) <= latest_step && check_checkpoint(st, p, Depth::Sizes).is_ok())
        .map(|(s, _)| s)
        .collect();
    let mut removed = Vec::new();
    for s in policy.to_delete(&valid) {
        if Some(s) == latest_step {
            continue;
        }
        let path = root.join(checkpoint_dir_name(s));
        let retention_err = |source| Error::Retention {
            step,
            path: path.clone(),
            source,
        };
        (|| {
            io_failpoint!(RETENTION);
            Ok(())
        })()
        .map_err(retention_err)?;
        let doomed = root.join(format!(
            "{TMP_PREFIX}del-{}-{}",
            checkpoint_dir_name(s),
            nonce()
        ));
        st.rename(&path, &doomed).map_err(retention_err)?;
        durability_step!(FSYNC_RETENTION, st.sync_dir(root)).map_err(retention_err)?;
        st.remove_dir_all(&doomed).map_err(retention_err)?;
        removed.push(s);
    }
    Ok(removed)
}

/// Applies `policy` to a root outside a save (the caller holds the lock), e.g. from
/// `ckpt gc`. Returns the removed steps.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage.
pub fn prune<'a>(at: impl Into<StoragePath<'a>>, policy: &Retention) -> Result<Vec<u64>> {
    let StoragePath {
        storage,
        path: root,
    } = at.into();
    let latest = read_latest(StoragePath::new(storage, root))?
        .and_then(|n| parse_step_dir(&n))
        .unwrap_or(0);
    apply_retention(storage, root, policy, latest)
}
