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

/// Durability steps the mutation check of the power-loss test can omit: with the failpoint of
/// that name set to `return`, the step is skipped as if the code did not have it, and the crash
/// test must then fail. Each names one sync the protocol relies on.
pub mod omit {
    /// The fsync of the parent of a checkpoint root the engine created (and of each ancestor
    /// it created), so the new root itself survives.
    pub const FSYNC_ROOT_PARENT: &str = "ckpt::omit::fsync_root_parent";
    /// Each part file's fsync.
    pub const FSYNC_PART: &str = "ckpt::omit::fsync_part";
    /// `manifest.json`'s fsync.
    pub const FSYNC_MANIFEST: &str = "ckpt::omit::fsync_manifest";
    /// The temporary directory's fsync, before its rename.
    pub const FSYNC_TMP_DIR: &str = "ckpt::omit::fsync_tmp_dir";
    /// The root's fsync after the rename (or exchange) to `step-*`.
    pub const FSYNC_ROOT: &str = "ckpt::omit::fsync_root";
    /// The fsync of the new `latest` file before it replaces the old one.
    pub const FSYNC_LATEST_FILE: &str = "ckpt::omit::fsync_latest_file";
    /// The root's fsync after `latest` is replaced: the durability every later step, retention
    /// among them, waits for.
    pub const FSYNC_ROOT_LATEST: &str = "ckpt::omit::fsync_root_latest";
    /// Retention's root fsync after moving a checkpoint aside, before deleting its files.
    pub const FSYNC_RETENTION: &str = "ckpt::omit::fsync_retention";
    /// The fsync of a file written by `write_durable_file` (a ZeRO rank's shard) before it is
    /// handed over for adoption.
    pub const FSYNC_DURABLE_FILE: &str = "ckpt::omit::fsync_durable_file";

    /// Every omission, in protocol order.
    pub const ALL: &[&str] = &[
        FSYNC_ROOT_PARENT,
        FSYNC_PART,
        FSYNC_MANIFEST,
        FSYNC_TMP_DIR,
        FSYNC_ROOT,
        FSYNC_LATEST_FILE,
        FSYNC_ROOT_LATEST,
        FSYNC_RETENTION,
        FSYNC_DURABLE_FILE,
    ];
}

/// Runs durability step `$e` (an `io::Result<()>`) unless the mutation check omits it through
/// failpoint `omit::$name`; without the `failpoints` feature it always runs.
macro_rules! durability_step {
    ($name:ident, $e:expr) => {{
        #[cfg(feature = "failpoints")]
        let omitted = fail::eval($crate::failpoints::omit::$name, |_| ()).is_some();
        #[cfg(not(feature = "failpoints"))]
        let omitted = false;
        if omitted { Ok(()) } else { $e }
    }};
}
pub(crate) use durability_step;
