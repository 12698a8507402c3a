//! Helpers shared by the ckpt-core integration tests.

use std::{fs, path::Path};

/// Names of the `.tmp*` entries (in-flight or leftover data) in `root`.
pub fn tmp_entries(root: &Path) -> Vec<String> {
    fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".tmp"))
        .collect()
}
