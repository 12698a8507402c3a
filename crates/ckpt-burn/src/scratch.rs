//! Where Burn's records are written out before they are copied into a checkpoint: a RAM
//! filesystem where one has room, else the checkpoint's root.
//!
//! Burn 0.22.1 writes a record without a buffer of the whole of it only through
//! `OptimizerRecord::save` / `ModuleRecord::save` (burn-pack's atomic file write), and that
//! write `fsync`s the file. A scratch file is read back into the checkpoint's part and removed
//! at once, so on the checkpoint's filesystem that sync wrote the whole record to disk for
//! nothing: a save's disk writes doubled, and its persist waited for them. On a RAM filesystem
//! (tmpfs, Linux's `/dev/shm`) a sync writes nothing. The record's bytes then sit in RAM while
//! they are copied into the part (as its tensors did before `save` freed them one by one):
//! memory that is not reclaimable, outside the process's RSS, and charged to its cgroup.
//!
//! A scratch file goes to `/dev/shm` when it is a tmpfs with room for the record plus
//! [`RAM_HEADROOM`]; otherwise to the root under a `.tmp-` name (which start-up recovery
//! removes), and the first such save of the process says why (a warning where `/dev/shm` is
//! there but too full). Should a write in `/dev/shm` fail, the rest of the process's saves use
//! the root, with a warning. Names in `/dev/shm` carry the process's pid namespace and pid;
//! before each scratch file a process writes there it removes those of dead processes of its
//! namespace (a crash's leftovers), so a crash leaks them only until the next save on that node.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Free space a RAM filesystem must keep beyond a record for its scratch file to go there.
pub(crate) const RAM_HEADROOM: u64 = 256 << 20;

/// The RAM filesystem scratch files go to where it has room.
const RAM_DIR: &str = "/dev/shm";

/// Prefix of every scratch file in [`RAM_DIR`].
const RAM_PREFIX: &str = "burn-ckpt-";

/// Set once a write in the RAM directory failed: the process's later saves use the root.
static RAM_FAILED: AtomicBool = AtomicBool::new(false);

/// Whether the process has said that its scratch files go to RAM (once).
static SAID_RAM: AtomicBool = AtomicBool::new(false);

/// Whether the process has said why a scratch file went to the root (once, whatever went to
/// RAM before: a `/dev/shm` that fills up later is said too).
static SAID_ROOT: AtomicBool = AtomicBool::new(false);

/// A scratch file's path: in RAM (a tmpfs with room for the record) or else in the root.
pub(crate) struct ScratchPath {
    /// Where the record is written.
    pub(crate) path: PathBuf,
    /// Whether that is the RAM directory.
    pub(crate) in_ram: bool,
}

/// Where the scratch file of a record of about `bytes` goes, for a checkpoint under `root`
/// (see the module docs). `part` and `step` name it.
pub(crate) fn scratch_path(root: &Path, part: &str, step: u64, bytes: u64) -> ScratchPath {
    let ram = Path::new(RAM_DIR);
    match ram_room(ram, bytes) {
        Ok(()) if !RAM_FAILED.load(Ordering::Relaxed) => {
            sweep(ram, pid_namespace(), |pid| {
                Path::new("/proc").join(pid.to_string()).exists()
            });
            say_once(&SAID_RAM, || {
                tracing::debug!(dir = RAM_DIR, "scratch files of Burn's records go to RAM")
            });
            ScratchPath {
                path: ram.join(ram_name(part, step)),
                in_ram: true,
            }
        }
        outcome => {
            say_once(&SAID_ROOT, || match &outcome {
                Err(Unusable::TooFull { free }) => tracing::warn!(
                    dir = RAM_DIR,
                    free_mib = free >> 20,
                    record_mib = bytes >> 20,
                    root = %root.display(),
                    "scratch files of Burn's records go to the checkpoint root: {RAM_DIR} has \
                     too little room, so each save writes its records to disk twice"
                ),
                Err(Unusable::NotRam) => tracing::info!(
                    root = %root.display(),
                    "scratch files of Burn's records go to the checkpoint root (no tmpfs at \
                     {RAM_DIR}): each save writes its records to disk twice"
                ),
                Ok(()) => {}
            });
            ScratchPath {
                path: root.join(root_name(part, step)),
                in_ram: false,
            }
        }
    }
}

/// Called when writing a scratch file in the RAM directory failed: later saves use the root.
pub(crate) fn ram_write_failed(path: &Path, error: &dyn std::fmt::Display) {
    if !RAM_FAILED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            path = %path.display(),
            %error,
            "writing a scratch file in RAM failed: this process's later saves write their \
             scratch files to the checkpoint root"
        );
    }
}

/// Runs `say` the first time `said` is set.
fn say_once(said: &AtomicBool, say: impl FnOnce()) {
    if !said.swap(true, Ordering::Relaxed) {
        say();
    }
}

/// Why the RAM directory takes no scratch file.
#[derive(Debug, PartialEq)]
enum Unusable {
    /// It is not a tmpfs (or not there).
    NotRam,
    /// It has `free` bytes, too few.
    TooFull { free: u64 },
}

/// Whether `dir` is a tmpfs with room for `bytes` plus [`RAM_HEADROOM`].
fn ram_room(dir: &Path, bytes: u64) -> Result<(), Unusable> {
    let free = tmpfs_free(dir).ok_or(Unusable::NotRam)?;
    if free >= bytes.saturating_add(RAM_HEADROOM) {
        Ok(())
    } else {
        Err(Unusable::TooFull { free })
    }
}

/// The bytes free to an unprivileged writer in `dir`, if it is a tmpfs.
#[cfg(target_os = "linux")]
fn tmpfs_free(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statfs the call fills.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    let (kind, avail, bsize) = (st.f_type as i64, st.f_bavail as u64, st.f_bsize as u64);
    (kind == TMPFS_MAGIC).then(|| avail.saturating_mul(bsize))
}

#[cfg(not(target_os = "linux"))]
fn tmpfs_free(_dir: &Path) -> Option<u64> {
    None
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`), `0` where unknown: pids
/// name processes only within one.
fn pid_namespace() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|l| {
                let l = l.to_string_lossy().into_owned();
                let digits: String = l.chars().filter(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
            .unwrap_or(0)
    })
}

/// A process-unique number for scratch names.
fn next() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// `burn-ckpt-<pid namespace>-<pid>-<part>-<step>-<n>.bpk`.
fn ram_name(part: &str, step: u64) -> String {
    format!(
        "{RAM_PREFIX}{}-{}-{part}-{step:08}-{}.bpk",
        pid_namespace(),
        std::process::id(),
        next()
    )
}

/// A name under the `.tmp-` prefix start-up recovery removes from a root.
fn root_name(part: &str, step: u64) -> String {
    format!(
        ".tmp-{part}-{step:08}-{}-{}.bpk",
        std::process::id(),
        next()
    )
}

/// Removes the scratch files in `dir` of namespace `ns` whose pid `alive` says is gone; says
/// what it removed.
fn sweep(dir: &Path, ns: u64, alive: impl Fn(u32) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| owner(n, ns)) else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), pid, "removed a scratch file a dead process left");
                removed.push(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a dead process's scratch file")
            }
        }
    }
    removed
}

/// The pid of a scratch name of namespace `ns` (burn-pack's in-progress names included, which
/// begin with the destination's name).
fn owner(name: &str, ns: u64) -> Option<u32> {
    let rest = name.strip_prefix(RAM_PREFIX)?;
    let (name_ns, rest) = rest.split_once('-')?;
    if name_ns.parse::<u64>().ok()? != ns {
        return None;
    }
    rest.split_once('-')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_gives_its_owner_only_in_its_namespace() {
        let name = ram_name("optim", 12);
        assert_eq!(owner(&name, pid_namespace()), Some(std::process::id()));
        assert_eq!(owner(&name, pid_namespace() + 1), None);
        // burn-pack's in-progress file beside the destination.
        assert_eq!(
            owner(&format!("{name}.77-0.tmp"), pid_namespace()),
            Some(std::process::id())
        );
        assert_eq!(owner("burn-ckpt-x-1-optim.bpk", pid_namespace()), None);
        assert_eq!(owner("other-1-2", pid_namespace()), None);
    }

    #[test]
    fn the_sweep_removes_only_dead_processes_files_of_its_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let ns = 4026531836;
        for name in [
            "burn-ckpt-4026531836-111-optim-00000002-0.bpk",
            "burn-ckpt-4026531836-111-model-00000002-1.bpk.111-0.tmp",
            "burn-ckpt-4026531836-222-optim-00000002-0.bpk",
            "burn-ckpt-1-111-optim-00000002-0.bpk",
            "unrelated-111",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let mut removed = sweep(dir.path(), ns, |pid| pid == 222);
        removed.sort();
        let names: Vec<String> = removed
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "burn-ckpt-4026531836-111-model-00000002-1.bpk.111-0.tmp",
                "burn-ckpt-4026531836-111-optim-00000002-0.bpk",
            ]
        );
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "burn-ckpt-1-111-optim-00000002-0.bpk",
                "burn-ckpt-4026531836-222-optim-00000002-0.bpk",
                "unrelated-111",
            ]
        );
    }

    #[test]
    fn only_a_tmpfs_with_room_takes_scratch_files() {
        // A directory on the build's disk is no RAM filesystem.
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        if tmpfs_free(disk.path()).is_none() {
            assert_eq!(ram_room(disk.path(), 1), Err(Unusable::NotRam));
        }
        let ram = Path::new(RAM_DIR);
        if let Some(free) = tmpfs_free(ram) {
            assert_eq!(ram_room(ram, 1), Ok(()));
            assert!(matches!(ram_room(ram, free), Err(Unusable::TooFull { .. })));
        }
    }
}
