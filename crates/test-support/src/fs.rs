//! Small filesystem helpers for checkpoint tests: the directory of a step, the temporary
//! entries left in a root, the verified steps and rewound entries of a root, and flipping one
//! byte of a file (corruption).

use std::path::{Path, PathBuf};

/// `ROOT/step-<step:08>`: the checkpoint directory of `step` under `root`.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(ckpt_core::layout::checkpoint_dir_name(step))
}

/// Names of the `.tmp*` entries (in-flight or leftover data) in `root`; panics if `root`
/// cannot be listed.
pub fn tmp_entries(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("listing {}: {e}", root.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".tmp"))
        .collect()
}

/// Which byte of a file [`flip_byte`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The byte at this offset from the start.
    Offset(usize),
    /// The byte at `len / 2`.
    Middle,
    /// The byte this many bytes before the end: `FromEnd(1)` is the last byte.
    FromEnd(usize),
}

/// XORs the byte of file `path` at `at` with `mask` (rewriting the file) and returns its
/// offset; panics if the file cannot be read or written or is too short.
pub fn flip_byte(path: &Path, at: At, mask: u8) -> usize {
    let mut bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let i = match at {
        At::Offset(i) => i,
        At::Middle => bytes.len() / 2,
        At::FromEnd(n) => bytes.len() - n,
    };
    bytes[i] ^= mask;
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    i
}

/// The steps of the checkpoints under `root` that fully verify, oldest first; panics if
/// `root` cannot be listed.
pub fn verified_steps(root: &Path) -> Vec<u64> {
    ckpt_core::list_checkpoints(root, true)
        .unwrap_or_else(|e| panic!("listing {}: {e}", root.display()))
        .iter()
        .map(|c| c.step)
        .collect()
}

/// Names of the checkpoints a rewind moved aside (`.rewound-*`) in `root`, sorted; panics if
/// `root` cannot be listed.
pub fn rewound_entries(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("listing {}: {e}", root.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(ckpt_core::layout::REWOUND_PREFIX))
        .collect();
    v.sort();
    v
}
