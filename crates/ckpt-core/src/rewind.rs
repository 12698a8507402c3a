//! Explicit rewinds of a root ([`crate::Engine::rewind`]): the checkpoints newer than the step
//! a run resumed from (all of them when it starts over) belong to a timeline the run abandons,
//! and are moved aside to `ROOT/.rewound-step-*` (kept for the user, invisible to listing,
//! resume and retention).
//!
//! A rewind is several renames, so it runs under a durable intent, `ROOT/.rewind`, written
//! (atomically: temporary file, fsync, rename, root fsync) before the first rename and removed
//! last (`latest` is moved first, then the checkpoints). Start-up recovery completes a rewind whose intent it finds, so
//! after a crash or a power cut at any point of it, `latest` and recovery never choose a
//! checkpoint of the abandoned timeline.

use std::path::{Path, PathBuf};

use crate::{
    Error, Result,
    latest::{remove_latest, write_latest},
    naming::{REWOUND_PREFIX, TMP_PREFIX, checkpoint_dir_name, nonce},
    storage::Storage,
};

/// The intent of a rewind in progress, in the root.
pub(crate) const REWIND_FILE: &str = ".rewind";

fn intent_text(to: Option<u64>) -> String {
    match to {
        Some(k) => format!("to {k}\n"),
        None => "to none\n".into(),
    }
}

fn parse_intent(path: &Path, bytes: &[u8]) -> Result<Option<u64>> {
    let text = String::from_utf8_lossy(bytes);
    match text.trim().strip_prefix("to ") {
        Some("none") => Ok(None),
        Some(n) => n
            .parse()
            .map(Some)
            .map_err(|_| Error::corrupt(path, format!("not a rewind intent: {:?}", text.trim()))),
        None => Err(Error::corrupt(
            path,
            format!("not a rewind intent: {:?}", text.trim()),
        )),
    }
}

/// Rewinds `root` to `to` (see the module docs); the steps moved aside and where. Durable
/// when it returns. Call under the writer lock with nothing being published.
pub(crate) fn rewind(
    st: &dyn Storage,
    root: &Path,
    to: Option<u64>,
) -> Result<Vec<(u64, PathBuf)>> {
    let later = crate::listing::step_dirs(st, root)?
        .into_iter()
        .any(|(step, _)| to.is_none_or(|k| step > k));
    if !later {
        return Ok(Vec::new());
    }
    let intent = root.join(REWIND_FILE);
    let tmp = root.join(format!("{TMP_PREFIX}rewind-{}", nonce()));
    (|| {
        let mut f = st.create_file(&tmp)?;
        f.write_all(intent_text(to).as_bytes())?;
        f.sync()?;
        drop(f);
        st.rename(&tmp, &intent)?;
        st.sync_dir(root)
    })()
    .map_err(|e| Error::io(&intent, e))?;
    complete(st, root, to)
}

/// Points `latest` at `to` first (so a reader that does not run recovery never follows it to
/// a checkpoint being moved), then moves every checkpoint newer than `to` aside (newest
/// first), then removes the intent; each step durable before the next.
fn complete(st: &dyn Storage, root: &Path, to: Option<u64>) -> Result<Vec<(u64, PathBuf)>> {
    let lf = root.join(crate::layout::LATEST_FILE);
    match to {
        Some(k) if st.exists(&root.join(checkpoint_dir_name(k))) => {
            write_latest(st, root, &checkpoint_dir_name(k))
        }
        // Start-up recovery points `latest` at the newest valid one.
        Some(_) => Ok(()),
        None => remove_latest(st, root),
    }
    .map_err(|e| Error::io(&lf, e))?;
    let mut moved = Vec::new();
    for (step, path) in crate::listing::step_dirs(st, root)?.into_iter().rev() {
        if to.is_some_and(|k| step <= k) {
            break;
        }
        let aside = root.join(format!(
            "{REWOUND_PREFIX}{}-{}",
            checkpoint_dir_name(step),
            nonce()
        ));
        st.rename(&path, &aside).map_err(|e| Error::io(&path, e))?;
        moved.push((step, aside));
    }
    st.sync_dir(root).map_err(|e| Error::io(root, e))?;
    let intent = root.join(REWIND_FILE);
    st.remove_file(&intent).map_err(|e| Error::io(&intent, e))?;
    st.sync_dir(root).map_err(|e| Error::io(root, e))?;
    Ok(moved)
}

/// For start-up recovery: completes a rewind that a crash interrupted, if its intent is in
/// `root`; the steps it moved aside (each a warning).
pub(crate) fn complete_interrupted(st: &dyn Storage, root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let intent = root.join(REWIND_FILE);
    if !st.exists(&intent) {
        return Ok(Vec::new());
    }
    let bytes = st.read(&intent).map_err(|e| Error::io(&intent, e))?;
    let to = parse_intent(&intent, &bytes)?;
    let moved = complete(st, root, to)?;
    tracing::warn!(
        to = ?to,
        moved = ?moved.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        "completed a rewind an earlier run had begun: checkpoints of the abandoned timeline \
         moved aside to .rewound-*"
    );
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalDisk;

    fn make_steps(root: &Path, steps: &[u64]) {
        std::fs::create_dir_all(root).unwrap();
        for s in steps {
            std::fs::create_dir(root.join(checkpoint_dir_name(*s))).unwrap();
        }
    }

    fn left(root: &Path) -> Vec<u64> {
        crate::listing::step_dirs(&LocalDisk, root)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    }

    #[test]
    fn an_interrupted_rewind_is_completed_from_its_intent() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        make_steps(root, &[2, 4, 6, 8]);
        // As if the rewind to 4 had died after its intent and its first rename (step 8).
        std::fs::write(root.join(REWIND_FILE), intent_text(Some(4))).unwrap();
        std::fs::rename(
            root.join(checkpoint_dir_name(8)),
            root.join(format!("{REWOUND_PREFIX}step-00000008-x")),
        )
        .unwrap();
        let moved = complete_interrupted(&LocalDisk, root).unwrap();
        assert_eq!(moved.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [6]);
        assert_eq!(left(root), [2, 4]);
        assert!(!root.join(REWIND_FILE).exists());
        assert_eq!(
            crate::read_latest(root).unwrap().as_deref(),
            Some("step-00000004")
        );
        // Nothing to do the second time.
        assert!(complete_interrupted(&LocalDisk, root).unwrap().is_empty());
    }

    #[test]
    fn a_rewind_to_none_moves_everything_aside_and_removes_latest() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        make_steps(root, &[2, 4]);
        write_latest(&LocalDisk, root, "step-00000004").unwrap();
        let moved = rewind(&LocalDisk, root, None).unwrap();
        assert_eq!(moved.len(), 2);
        assert!(left(root).is_empty());
        assert_eq!(crate::read_latest(root).unwrap(), None);
        assert!(!root.join(REWIND_FILE).exists());
    }

    #[test]
    fn an_unreadable_intent_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(REWIND_FILE), "back to 4").unwrap();
        let e = complete_interrupted(&LocalDisk, tmp.path()).unwrap_err();
        assert!(e.to_string().contains(".rewind"), "{e}");
    }
}
