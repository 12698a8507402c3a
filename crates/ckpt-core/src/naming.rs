//! Names in a checkpoint root: checkpoint directories, the root's reserved entries, temporary
//! names, and the rule for part (file) names inside a checkpoint.
//!
//! ```text
//! ROOT/step-00000120/manifest.json   written last
//! ROOT/step-00000120/<parts>
//! ROOT/latest                        name of the newest published checkpoint
//! ROOT/.tmp-*                        in flight; never read, removed at start-up
//! ROOT/.invalid-*                    invalid checkpoints moved aside by recovery
//! ROOT/.lock                         the writer lock
//! ```

use crate::layout::MANIFEST_FILE;

/// File name of the pointer to the newest published checkpoint.
pub const LATEST_FILE: &str = "latest";
/// File name of the writer lock.
pub const LOCK_FILE: &str = ".lock";
/// Prefix of in-flight entries in the root; start-up recovery removes them.
pub(crate) const TMP_PREFIX: &str = ".tmp-";
/// Prefix under which recovery moves invalid checkpoints aside.
pub(crate) const QUARANTINE_PREFIX: &str = ".invalid-";
/// Prefix under which [`crate::Engine::rewind`] moves checkpoints of an abandoned timeline
/// aside (kept, never collected: delete them by hand once they are not wanted).
pub const REWOUND_PREFIX: &str = ".rewound-";

/// `step-<step:08>`.
pub fn checkpoint_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// The step of a `step-*` directory name.
pub fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A suffix that makes a temporary name unique: pid, a per-process counter and the clock.
pub(crate) fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{n}-{t:08x}", std::process::id())
}

/// Why [`check_part_names`] refused a list of part names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartNameError<'a> {
    /// The name is not a plain, non-reserved file name.
    NotPlain(&'a str),
    /// The name appears more than once.
    Duplicate(&'a str),
}

/// The one rule for the names of the files (parts) of a checkpoint, applied both to a
/// snapshot's parts before writing and to a manifest's entries when reading: each name must be
/// a plain file name inside the checkpoint directory, so a hostile or corrupt entry like `../x`
/// cannot make readers touch other files, and must not be reserved; and no name may appear
/// twice. Refused: the empty name, `.` and `..`, names containing `/`, `\` or NUL, names
/// starting with `.tmp` (temporary entries), and [`MANIFEST_FILE`]. Names are checked in order;
/// the first problem is returned.
pub(crate) fn check_part_names<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<(), PartNameError<'a>> {
    let mut seen = std::collections::BTreeSet::new();
    for n in names {
        let reserved = n.is_empty()
            || n == "."
            || n == ".."
            || n.contains(['/', '\\', '\0'])
            || n.starts_with(".tmp")
            || n == MANIFEST_FILE;
        if reserved {
            return Err(PartNameError::NotPlain(n));
        }
        if !seen.insert(n) {
            return Err(PartNameError::Duplicate(n));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{Error, Manifest, Snapshot, layout::FileEntry};

    #[test]
    fn step_dir_names_roundtrip() {
        assert_eq!(checkpoint_dir_name(120), "step-00000120");
        assert_eq!(parse_step_dir("step-00000120"), Some(120));
        assert_eq!(parse_step_dir("step-120"), None);
        assert_eq!(parse_step_dir("step-0000012x"), None);
        assert_eq!(parse_step_dir(".tmp-step-00000120"), None);
    }

    #[test]
    fn part_name_rule() {
        for ok in [
            "model.bpk",
            "a",
            ".hidden",
            "tmp",
            "x.tmp",
            "manifest.json.bak",
        ] {
            assert_eq!(check_part_names([ok]), Ok(()), "{ok:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/abs",
            "x\\y",
            "nul\0byte",
            ".tmp",
            ".tmp-x",
            ".tmpfile",
            MANIFEST_FILE,
        ] {
            assert_eq!(
                check_part_names([bad]),
                Err(PartNameError::NotPlain(bad)),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_part_names(["a", "b", "a"]),
            Err(PartNameError::Duplicate("a"))
        );
        // The first problem in order wins.
        assert_eq!(
            check_part_names(["a", "a", ""]),
            Err(PartNameError::Duplicate("a"))
        );
        assert_eq!(
            check_part_names(["", "a", "a"]),
            Err(PartNameError::NotPlain(""))
        );
    }

    /// The snapshot side always refused `.tmp*` part names; the manifest side used to accept
    /// them. Both now apply the same rule, so a manifest listing one is corrupt.
    #[test]
    fn tmp_names_are_refused_by_snapshots_and_manifests_alike() {
        let snap = Snapshot::new(3).with_bytes(".tmp-x", vec![1]);
        assert!(matches!(
            snap.validate(),
            Err(Error::InvalidSnapshot { step: 3, .. })
        ));
        let m = Manifest {
            format_version: crate::layout::FORMAT_VERSION,
            step: 3,
            epoch: 0,
            world_size: 1,
            layout: "single".into(),
            created_unix_ms: 1,
            files: vec![FileEntry {
                name: ".tmp-x".into(),
                size: 1,
                xxh3: "0011223344556677".into(),
            }],
            meta: Default::default(),
        };
        let path = Path::new("manifest.json");
        match Manifest::from_bytes(&m.to_bytes(), path) {
            Err(Error::Corrupt { reason, .. }) => {
                assert!(reason.contains("not a plain file name"), "{reason}")
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
}
