//! Names of the failpoints (the `fail` crate) placed at every step of the publication protocol.
//!
//! They are compiled in only with the `failpoints` feature. A `return` action may carry an
//! argument naming the error: `enospc`, `eio` (default: a generic injected error).

/// Before each part file is created and written.
pub const WRITE_PART: &str = "ckpt::write_part";
/// Before each part file is fsynced.
pub const FSYNC_PART: &str = "ckpt::fsync_part";
/// Before `manifest.json` is written.
pub const WRITE_MANIFEST: &str = "ckpt::write_manifest";
/// Before `manifest.json` is fsynced.
pub const FSYNC_MANIFEST: &str = "ckpt::fsync_manifest";
/// Before the temporary directory is fsynced.
pub const FSYNC_TMP_DIR: &str = "ckpt::fsync_tmp_dir";
/// Before the temporary directory is renamed to `step-*`.
pub const RENAME: &str = "ckpt::rename";
/// Before the root is fsynced after the rename.
pub const FSYNC_ROOT: &str = "ckpt::fsync_root";
/// Before the new `latest` is written to its temporary file.
pub const WRITE_LATEST: &str = "ckpt::write_latest";
/// Before the temporary `latest` replaces the old one.
pub const RENAME_LATEST: &str = "ckpt::rename_latest";
/// Before each old checkpoint is removed by retention.
pub const RETENTION: &str = "ckpt::retention";

/// Every protocol failpoint, in protocol order.
pub const ALL: &[&str] = &[
    WRITE_PART,
    FSYNC_PART,
    WRITE_MANIFEST,
    FSYNC_MANIFEST,
    FSYNC_TMP_DIR,
    RENAME,
    FSYNC_ROOT,
    WRITE_LATEST,
    RENAME_LATEST,
    RETENTION,
];

/// Builds the I/O error a `return(arg)` failpoint action injects.
pub fn injected_error(name: &str, arg: Option<String>) -> std::io::Error {
    match arg.as_deref() {
        Some("enospc") => std::io::Error::from_raw_os_error(28),
        Some("eio") => std::io::Error::from_raw_os_error(5),
        _ => std::io::Error::other(format!("injected failure at failpoint {name}")),
    }
}

/// Evaluates a failpoint that returns an injected `io::Error`.
macro_rules! io_failpoint {
    ($name:ident) => {
        fail::fail_point!($crate::failpoints::$name, |arg| {
            Err($crate::failpoints::injected_error(
                $crate::failpoints::$name,
                arg,
            ))
        })
    };
}
pub(crate) use io_failpoint;
