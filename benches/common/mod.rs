//! What the criterion benches share.

use std::path::PathBuf;

/// A fresh directory to write into: under `CKPT_BENCH_DIR` when set, else under `target/`
/// (the same filesystem the floors are measured on).
pub(crate) fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var("CKPT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}
