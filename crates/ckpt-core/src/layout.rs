//! The on-disk layout of a checkpoint root: naming, listing, verification, the `latest`
//! pointer, start-up recovery and retention.
//!
//! ```text
//! ROOT/step-00000120/manifest.json   written last
//! ROOT/step-00000120/<parts>
//! ROOT/latest                        name of the newest published checkpoint
//! ROOT/.tmp-*                        in flight; never read, removed at start-up
//! ROOT/.lock                         the writer lock
//! ```

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{Error, MANIFEST_FILE, Manifest, Result, checksum, failpoints::io_failpoint};

/// File name of the pointer to the newest published checkpoint.
pub const LATEST_FILE: &str = "latest";
/// File name of the writer lock.
pub const LOCK_FILE: &str = ".lock";
pub(crate) const TMP_PREFIX: &str = ".tmp-";
const QUARANTINE_PREFIX: &str = ".invalid-";

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

/// A checkpoint directory found in a root.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointInfo {
    /// Step.
    pub step: u64,
    /// Directory.
    pub path: PathBuf,
    /// Parsed manifest, when valid.
    #[serde(skip)]
    pub manifest: Option<Manifest>,
    /// Total bytes of its files, when the manifest is valid.
    pub bytes: u64,
    /// Whether `latest` names it.
    pub latest: bool,
    /// Verification status.
    pub status: CheckpointStatus,
}

/// How far a checkpoint was verified.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "status", content = "reason", rename_all = "snake_case")]
pub enum CheckpointStatus {
    /// Every file exists with the listed size and checksum.
    Verified,
    /// Manifest valid and sizes match; checksums not computed.
    SizesOk,
    /// Missing or corrupt; the reason names the file.
    Invalid(String),
}

/// Lists `step-*` directories in `root`, oldest first. With `full`, every checksum is checked;
/// otherwise only the manifest and file sizes.
pub fn list_checkpoints(root: &Path, full: bool) -> Result<Vec<CheckpointInfo>> {
    let latest = read_latest(root).ok().flatten();
    let mut out = Vec::new();
    for (step, path) in step_dirs(root)? {
        let res = if full {
            verify_checkpoint(&path)
        } else {
            quick_check(&path)
        };
        let (manifest, status) = match res {
            Ok(m) => (
                Some(m),
                if full {
                    CheckpointStatus::Verified
                } else {
                    CheckpointStatus::SizesOk
                },
            ),
            Err(e) => (None, CheckpointStatus::Invalid(e.to_string())),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        out.push(CheckpointInfo {
            step,
            bytes: manifest.as_ref().map(|m| m.total_bytes()).unwrap_or(0),
            manifest,
            latest: latest.as_deref() == Some(name.as_str()),
            path,
            status,
        });
    }
    Ok(out)
}

pub(crate) fn step_dirs(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let rd = match fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(root, e)),
    };
    let mut v = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| Error::io(root, e))?;
        if let Some(step) = ent.file_name().to_str().and_then(parse_step_dir)
            && ent.file_type().map(|t| t.is_dir()).unwrap_or(false)
        {
            v.push((step, ent.path()));
        }
    }
    v.sort();
    Ok(v)
}

/// Reads and checks (self-checksum, format) the manifest of checkpoint directory `dir`, without
/// reading the files it lists.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = fs::read(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::corrupt(&path, "manifest is missing (checkpoint incomplete)")
        } else {
            Error::io(&path, e)
        }
    })?;
    let m = Manifest::from_bytes(&bytes, &path)?;
    let expected = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_step_dir);
    if let Some(s) = expected
        && s != m.step
    {
        return Err(Error::corrupt(
            &path,
            format!(
                "manifest says step {} but the directory is step {s}",
                m.step
            ),
        ));
    }
    Ok(m)
}

fn quick_check(dir: &Path) -> Result<Manifest> {
    let m = read_manifest(dir)?;
    for f in &m.files {
        let p = dir.join(&f.name);
        let len = fs::metadata(&p)
            .map_err(|e| Error::corrupt(&p, format!("listed in the manifest but unreadable: {e}")))?
            .len();
        if len != f.size {
            return Err(Error::corrupt(
                &p,
                format!("size {len} differs from the manifest's {}", f.size),
            ));
        }
    }
    Ok(m)
}

/// Fully verifies one checkpoint directory: manifest self-checksum, every file's size and
/// checksum. Errors name the offending file.
pub fn verify_checkpoint(dir: &Path) -> Result<Manifest> {
    let m = quick_check(dir)?;
    for f in &m.files {
        let p = dir.join(&f.name);
        let file = fs::File::open(&p).map_err(|e| Error::io(&p, e))?;
        let (digest, len) = checksum::of_reader(file).map_err(|e| Error::io(&p, e))?;
        if len != f.size {
            return Err(Error::corrupt(
                &p,
                format!("size {len} differs from the manifest's {}", f.size),
            ));
        }
        let hex = checksum::hex(digest);
        if hex != f.xxh3 {
            return Err(Error::corrupt(
                &p,
                format!("checksum mismatch (manifest {}, file {hex})", f.xxh3),
            ));
        }
    }
    Ok(m)
}

/// Reads one part of a checkpoint and checks it against the manifest.
pub fn read_part(dir: &Path, name: &str) -> Result<Vec<u8>> {
    read_manifest(dir)?.read_part_into(dir, name, |size| vec![0u8; size])
}

/// Bytes read (and hashed) per step of a verified read: large enough for few system calls,
/// small enough that the chunk is still in cache when it is hashed.
const VERIFY_CHUNK: usize = 1 << 20;

impl Manifest {
    /// Reads part `name` of checkpoint `dir` (the directory this manifest was read from) into
    /// the buffer `alloc(size)` returns, `size` being the manifest's size for the part, and
    /// checks it while reading: the file is read once, in cache-sized chunks, each hashed
    /// (XXH3) right after it is read. The buffer must hold at least `size` bytes; its first
    /// `size` bytes are filled and the rest is left as `alloc` made it. Errors name the file: a
    /// part the manifest does not list, a missing file, a size or checksum that differs
    /// ([`Error::Corrupt`]), or an I/O error ([`Error::Io`]).
    pub fn read_part_into<B>(
        &self,
        dir: &Path,
        name: &str,
        alloc: impl FnOnce(usize) -> B,
    ) -> Result<B>
    where
        B: std::ops::DerefMut<Target = [u8]>,
    {
        let p = dir.join(name);
        let entry = self
            .file(name)
            .ok_or_else(|| Error::corrupt(&p, "not listed in the checkpoint's manifest"))?;
        let mut file = fs::File::open(&p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::corrupt(&p, "file is missing")
            } else {
                Error::io(&p, e)
            }
        })?;
        let size_err = |len: u64| {
            Error::corrupt(
                &p,
                format!("size {len} differs from the manifest's {}", entry.size),
            )
        };
        // Checked before allocating, so a file of the wrong size costs no buffer.
        let len = file.metadata().map_err(|e| Error::io(&p, e))?.len();
        if len != entry.size {
            return Err(size_err(len));
        }
        let size = usize::try_from(entry.size).map_err(|_| size_err(len))?;
        let mut buf = alloc(size);
        if buf.len() < size {
            return Err(Error::corrupt(
                &p,
                format!(
                    "read buffer of {} bytes is smaller than the part's {size}",
                    buf.len()
                ),
            ));
        }
        let digest = checksum::read_hashed(&mut file, &mut buf[..size], VERIFY_CHUNK)
            .map_err(|e| Error::io(&p, e))?;
        let digest = match digest {
            checksum::Filled::Exactly(d) => d,
            checksum::Filled::Short(n) => return Err(size_err(n as u64)),
            checksum::Filled::Longer => {
                let now = file.metadata().map(|m| m.len()).unwrap_or(entry.size + 1);
                return Err(size_err(now.max(entry.size + 1)));
            }
        };
        let hex = checksum::hex(digest);
        if hex != entry.xxh3 {
            return Err(Error::corrupt(
                &p,
                format!("checksum mismatch (manifest {}, file {hex})", entry.xxh3),
            ));
        }
        Ok(buf)
    }

    /// Checks part `name` of checkpoint `dir` (the directory this manifest was read from)
    /// against this manifest without keeping its bytes: size and checksum, streamed. The
    /// errors are those of [`Manifest::read_part_into`].
    pub fn verify_part(&self, dir: &Path, name: &str) -> Result<()> {
        let p = dir.join(name);
        let entry = self
            .file(name)
            .ok_or_else(|| Error::corrupt(&p, "not listed in the checkpoint's manifest"))?;
        verify_file(&p, entry)
    }
}

/// Size and checksum of one file against its manifest entry, streamed.
fn verify_file(p: &Path, f: &crate::FileEntry) -> Result<()> {
    let file = fs::File::open(p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::corrupt(p, "file is missing")
        } else {
            Error::io(p, e)
        }
    })?;
    let (digest, len) = checksum::of_reader(file).map_err(|e| Error::io(p, e))?;
    if len != f.size {
        return Err(Error::corrupt(
            p,
            format!("size {len} differs from the manifest's {}", f.size),
        ));
    }
    let hex = checksum::hex(digest);
    if hex != f.xxh3 {
        return Err(Error::corrupt(
            p,
            format!("checksum mismatch (manifest {}, file {hex})", f.xxh3),
        ));
    }
    Ok(())
}

/// Verifies every checkpoint in `root` and that `latest`, if present, names a valid one (it may
/// be missing or lag behind after a crash; recovery repairs both). Returns the list; the error
/// is the first problem found.
pub fn verify_root(root: &Path) -> Result<Vec<CheckpointInfo>> {
    let list = list_checkpoints(root, true)?;
    if let Some(bad) = list.iter().find_map(|c| match &c.status {
        CheckpointStatus::Invalid(r) => Some((c.path.clone(), r.clone())),
        _ => None,
    }) {
        return Err(Error::corrupt(bad.0, bad.1));
    }
    match read_latest(root)? {
        Some(name) if !list.iter().any(|c| c.latest) => {
            return Err(Error::corrupt(
                root.join(LATEST_FILE),
                format!("names {name:?}, which is not a published checkpoint"),
            ));
        }
        // No `latest` beside published checkpoints: a crash between the first publish's
        // rename and its `latest` write. Nothing is wrong with the checkpoints, and the next
        // start names the newest valid one (as when `latest` lags behind a newer checkpoint).
        Some(_) | None => {}
    }
    Ok(list)
}

/// Reads `ROOT/latest` (None if absent).
pub fn read_latest(root: &Path) -> Result<Option<String>> {
    let p = root.join(LATEST_FILE);
    match fs::read_to_string(&p) {
        Ok(s) => {
            let name = s.trim().to_string();
            if parse_step_dir(&name).is_none() {
                return Err(Error::corrupt(
                    &p,
                    format!("does not name a checkpoint directory: {name:?}"),
                ));
            }
            Ok(Some(name))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&p, e)),
    }
}

pub(crate) fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

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

/// Atomically replaces `ROOT/latest` with `name` (tmp + fsync + rename + fsync dir).
pub(crate) fn write_latest(root: &Path, name: &str) -> std::io::Result<()> {
    let tmp = root.join(format!("{TMP_PREFIX}latest-{}", nonce()));
    let res = (|| {
        io_failpoint!(WRITE_LATEST);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(name.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        io_failpoint!(RENAME_LATEST);
        fs::rename(&tmp, root.join(LATEST_FILE))?;
        fsync_dir(root)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

fn remove_latest(root: &Path) -> std::io::Result<()> {
    match fs::remove_file(root.join(LATEST_FILE)) {
        Ok(()) => fsync_dir(root),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// What start-up recovery found and did.
#[derive(Debug, Default, Serialize)]
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

/// Start-up recovery. Must run under the writer lock: removes stale `.tmp-*`, finds the newest
/// checkpoint that fully verifies, moves newer invalid ones aside (warning for each), and makes
/// `latest` name the newest valid checkpoint.
pub fn recover(root: &Path) -> Result<RecoveryReport> {
    let mut report = RecoveryReport::default();
    fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
    for ent in fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let ent = ent.map_err(|e| Error::io(root, e))?;
        if ent.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            let p = ent.path();
            let r = if ent.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            r.map_err(|e| Error::io(&p, e))?;
            tracing::info!(path = %p.display(), "removed stale in-flight checkpoint data");
            report.removed_tmp.push(p);
        }
    }
    let dirs = step_dirs(root)?;
    for (step, path) in dirs.into_iter().rev() {
        match verify_checkpoint(&path) {
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
                fs::rename(&path, &aside).map_err(|e| Error::io(&path, e))?;
                tracing::warn!(checkpoint = %path.display(), %reason, moved_to = %aside.display(),
                    "checkpoint is invalid; falling back to an older one");
                report.quarantined.push((path, reason));
            }
        }
    }
    let current = read_latest(root).ok().flatten();
    let want = report.latest.as_ref().map(|c| checkpoint_dir_name(c.step));
    if current != want {
        report.repaired_latest = true;
        match &want {
            Some(name) => {
                write_latest(root, name).map_err(|e| Error::io(root.join(LATEST_FILE), e))?
            }
            None => remove_latest(root).map_err(|e| Error::io(root.join(LATEST_FILE), e))?,
        }
    }
    fsync_dir(root).map_err(|e| Error::io(root, e))?;
    Ok(report)
}

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
/// crash midway never leaves a half-deleted `step-*` directory.
pub(crate) fn apply_retention(root: &Path, policy: &Retention, step: u64) -> Result<Vec<u64>> {
    let latest_step = read_latest(root)
        .ok()
        .flatten()
        .and_then(|n| parse_step_dir(&n));
    let valid: Vec<u64> = step_dirs(root)?
        .into_iter()
        .filter(|(s, p)| Some(*s) <= latest_step && quick_check(p).is_ok())
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
        fs::rename(&path, &doomed).map_err(retention_err)?;
        fsync_dir(root).map_err(retention_err)?;
        fs::remove_dir_all(&doomed).map_err(retention_err)?;
        removed.push(s);
    }
    Ok(removed)
}

/// Applies `policy` to a root outside a save (the caller holds the lock), e.g. from `ckpt gc`.
/// Returns the removed steps.
pub fn prune(root: &Path, policy: &Retention) -> Result<Vec<u64>> {
    let latest = read_latest(root)?
        .and_then(|n| parse_step_dir(&n))
        .unwrap_or(0);
    apply_retention(root, policy, latest)
}

/// Removes stale `.tmp-*` and quarantined `.invalid-*` entries and invalid `step-*`
/// directories (the caller holds the lock). Returns what was removed.
pub fn garbage_collect(root: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = recover(root)?.removed_tmp;
    for ent in fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let ent = ent.map_err(|e| Error::io(root, e))?;
        let name = ent.file_name().to_string_lossy().to_string();
        let p = ent.path();
        let invalid_step = parse_step_dir(&name).is_some() && verify_checkpoint(&p).is_err();
        if name.starts_with(QUARANTINE_PREFIX) || invalid_step {
            fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
            removed.push(p);
        }
    }
    Ok(removed)
}
