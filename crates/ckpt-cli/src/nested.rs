//! Checkpoint roots below a directory that holds none itself: what `ckpt ls` and `ckpt verify`
//! name when pointed one level too high (a run's directory instead of its checkpoint root) or
//! at a memory tier's node directory, whose parts are roots two levels down
//! (`<node dir>/run-<id>/rank-<r>-of-<n>/`, `.../replica-<q>-of-<n>/`).

use std::path::{Path, PathBuf};

use ckpt_core::{layout::parse_step_dir, list_checkpoints};

/// How many levels below the directory roots are looked for.
const DEPTH: usize = 3;
/// Directories looked at, at most, so that pointing at `/` does not walk the disk.
const BUDGET: usize = 2000;
/// Roots named in the note; the rest are counted.
const SHOWN: usize = 8;

/// One line naming the checkpoint roots below `dir` (not `dir` itself), with how many
/// checkpoints each holds; `None` when there are none.
pub(crate) fn note_below(dir: &Path) -> Option<String> {
    note(&roots_below(dir))
}

/// Checkpoint roots below `dir` (not `dir` itself) with how many checkpoints each holds, in
/// path order. Unreadable directories are passed over.
fn roots_below(dir: &Path) -> Vec<(PathBuf, usize)> {
    let mut found = Vec::new();
    let mut budget = BUDGET;
    walk(dir, DEPTH, &mut budget, &mut found);
    found
}

fn walk(dir: &Path, depth: usize, budget: &mut usize, found: &mut Vec<(PathBuf, usize)>) {
    if depth == 0 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut subdirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            // Hidden entries (`.tmp-*`, `.rewound-*`) and checkpoints are not roots.
            !name.starts_with('.') && parse_step_dir(&name).is_none()
        })
        .map(|e| e.path())
        .collect();
    subdirs.sort();
    for sub in subdirs {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        match list_checkpoints(&sub, false) {
            Ok(list) if !list.is_empty() => found.push((sub, list.len())),
            _ => walk(&sub, depth - 1, budget, found),
        }
    }
}

/// One line naming the roots `found` (`None` when there are none).
fn note(found: &[(PathBuf, usize)]) -> Option<String> {
    if found.is_empty() {
        return None;
    }
    let mut names: Vec<String> = found
        .iter()
        .take(SHOWN)
        .map(|(p, n)| format!("{} ({n})", p.display()))
        .collect();
    if found.len() > SHOWN {
        names.push(format!("and {} more", found.len() - SHOWN));
    }
    Some(format!(
        "checkpoint roots below it (checkpoints in each): {}; pass one of them",
        names.join(", ")
    ))
}
