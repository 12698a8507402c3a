//! The storage layer under the publication protocol: every file-system operation that
//! publication, recovery, retention, `latest`, garbage collection and the adoption of
//! per-rank files perform goes through [`Storage`], in the spirit of tantivy's `Directory`.
//! Each method states what it guarantees **after a power cut**, not only after a process
//! crash, because that is what the protocol's correctness rests on:
//!
//! - nothing is durable until it is synced: a file's data by [`WriteFile::sync`], the
//!   creation, rename or removal of a name by [`Storage::sync_dir`] of the directory holding
//!   it (for a rename, both directories);
//! - an entry's operations in one directory become durable in the order they were made (what
//!   journaling file systems give; the simulated disk of the crash test assumes no more);
//! - a rename or an exchange is atomic: after a cut the name refers to the old object or to
//!   the new one, never to neither or to a mix.
//!
//! [`LocalDisk`] is the default implementation on the local file system: large files with
//! direct I/O past the page cache (early writeback where the file system refuses it), `fsync`,
//! `renameat2` exchange, `flock`.

use std::{
    fmt,
    fs::{self, File, OpenOptions, TryLockError},
    io::{self, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use crate::direct::DirectFile;
pub use crate::direct::{DirectIoStats, direct_io_stats};

/// A path and the [`Storage`] it lives on: what every function that reads or writes a
/// checkpoint root or a checkpoint directory takes ([`crate::read_latest`],
/// [`crate::verify_checkpoint`], [`crate::recover`], ...). A plain path (`&Path`, `&PathBuf`,
/// `&str`) converts to one on the local disk; [`StoragePath::new`] names another storage.
#[derive(Debug, Clone, Copy)]
pub struct StoragePath<'a> {
    /// The storage.
    pub storage: &'a dyn Storage,
    /// The path on it.
    pub path: &'a Path,
}

impl<'a> StoragePath<'a> {
    /// `path` on `storage`.
    pub fn new(storage: &'a dyn Storage, path: &'a Path) -> Self {
        Self { storage, path }
    }

    /// `path` on the local disk.
    pub fn local(path: &'a Path) -> Self {
        /// The local disk, for paths given without a storage.
        static LOCAL: LocalDisk = LocalDisk;
        Self {
            storage: &LOCAL,
            path,
        }
    }
}

impl<'a> From<&'a Path> for StoragePath<'a> {
    fn from(path: &'a Path) -> Self {
        Self::local(path)
    }
}

impl<'a> From<&'a PathBuf> for StoragePath<'a> {
    fn from(path: &'a PathBuf) -> Self {
        Self::local(path)
    }
}

impl<'a> From<&'a str> for StoragePath<'a> {
    fn from(path: &'a str) -> Self {
        Self::local(Path::new(path))
    }
}

/// A file opened for writing by [`Storage::create_file`].
pub trait WriteFile: Write + Send {
    /// Makes the data written so far durable (Linux `fsync`). Until it returns, a power cut
    /// may keep any prefix of the unsynced data, with its last block torn. The file's name is
    /// not made durable by this; see [`Storage::sync_dir`].
    fn sync(&mut self) -> io::Result<()>;
}

/// A file opened for reading by [`Storage::open`].
pub trait ReadFile: Read + Send {
    /// The file's current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// True when the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (not a path); names that are not UTF-8 are listed lossily.
    pub name: String,
    /// True for a directory.
    pub is_dir: bool,
}

/// What [`Storage::metadata`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryMeta {
    /// True for a directory.
    pub is_dir: bool,
    /// Length in bytes (files).
    pub len: u64,
}

/// Held by the writer that took a root's lock; dropping it releases the lock.
pub trait LockGuard: Send + Sync + fmt::Debug {}

/// The outcome of [`Storage::try_lock`].
#[derive(Debug)]
pub enum LockAttempt {
    /// The lock is ours until the guard is dropped.
    Acquired(Box<dyn LockGuard>),
    /// Another writer holds it; the text says who, as far as known.
    HeldBy(String),
}

/// The file-system operations of the publication protocol, each with its durability contract.
/// Paths are full paths. Implementations must be usable from several threads.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates directory `path`, whose parent exists; fails if it exists. The new name is
    /// durable only after [`Storage::sync_dir`] of the parent.
    fn create_dir(&self, path: &Path) -> io::Result<()>;

    /// Creates `path` and any missing ancestors; succeeds if it exists. Durable only after
    /// each new directory's parent is synced.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Creates a new, empty file at `path` for writing; fails if anything exists there. Its
    /// data is durable after [`WriteFile::sync`], its name after [`Storage::sync_dir`] of the
    /// parent, each independently of the other.
    fn create_file(&self, path: &Path) -> io::Result<Box<dyn WriteFile>>;

    /// Makes every creation, rename and removal of a name in directory `path` made so far
    /// durable (Linux `fsync` of the directory).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Renames `from` to `to` atomically. A file replaces a file at `to`; a directory needs
    /// `to` absent or an empty directory. After a power cut each name refers to the old or the
    /// new object; the rename is durable once both parents are synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Atomically swaps the objects named `a` and `b`, which both exist (Linux
    /// `renameat2(RENAME_EXCHANGE)`), so that each name refers to a complete object at every
    /// instant; durable once both parents are synced. Implementations that cannot do it
    /// atomically return [`io::ErrorKind::Unsupported`] rather than emulate it.
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()>;

    /// Opens file `path` for reading. Reads see every write made before, synced or not.
    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>>;

    /// Reads all of file `path`.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut f = self.open(path)?;
        let mut v = Vec::with_capacity(usize::try_from(f.len()?).unwrap_or(0));
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    /// Kind and length of `path`.
    fn metadata(&self, path: &Path) -> io::Result<EntryMeta>;

    /// True when something exists at `path`.
    fn exists(&self, path: &Path) -> bool {
        self.metadata(path).is_ok()
    }

    /// The entries of directory `path`, in no particular order.
    fn list(&self, path: &Path) -> io::Result<Vec<DirEntry>>;

    /// Removes file `path`; durable after [`Storage::sync_dir`] of the parent.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Removes directory `path` and everything in it. Not atomic: a cut midway may leave any
    /// part of the tree, so the protocol first renames a directory it deletes to a name that
    /// recovery removes, and syncs that rename.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Tries to take the exclusive writer lock `path` (a file it may create), writing `holder`
    /// into it for others' messages. A lock whose holder died is free again.
    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockAttempt>;
}

/// The local file system: `std::fs`, direct I/O for the full 8 MiB chunks of large files
/// (`O_DIRECT`, from reused aligned buffers; early writeback with `sync_file_range` where the
/// file system refuses it), `fsync` (`File::sync_all`), `renameat2(RENAME_EXCHANGE)` and
/// `flock`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalDisk;

/// A local file being written: direct I/O for full chunks (early writeback where the file
/// system refuses it), `fsync` on [`WriteFile::sync`].
struct LocalWriteFile(DirectFile);

impl Write for LocalWriteFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl WriteFile for LocalWriteFile {
    fn sync(&mut self) -> io::Result<()> {
        self.0.flush()?;
        self.0.get_ref().sync_all()
    }
}

impl ReadFile for File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

/// The `flock` of a local lock file, released when the file is closed.
#[derive(Debug)]
struct LocalLock(#[allow(dead_code)] File);

impl LockGuard for LocalLock {}

impl Storage for LocalDisk {
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }
    fn create_file(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(LocalWriteFile(DirectFile::new(f, path))))
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        exchange(a, b)
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        Ok(Box::new(File::open(path)?))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }
    fn metadata(&self, path: &Path) -> io::Result<EntryMeta> {
        let m = fs::metadata(path)?;
        Ok(EntryMeta {
            is_dir: m.is_dir(),
            len: m.len(),
        })
    }
    fn list(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for ent in fs::read_dir(path)? {
            let ent = ent?;
            out.push(DirEntry {
                name: ent.file_name().to_string_lossy().into_owned(),
                is_dir: ent.file_type().map(|t| t.is_dir()).unwrap_or(false),
            });
        }
        Ok(out)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }
    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockAttempt> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut held = String::new();
                let _ = file.read_to_string(&mut held);
                return Ok(LockAttempt::HeldBy(held.trim().to_string()));
            }
            Err(TryLockError::Error(e)) => return Err(e),
        }
        // Only for others' messages: a failure here does not weaken the lock.
        let _ = file.set_len(0);
        let _ = file.seek(SeekFrom::Start(0));
        let _ = file.write_all(holder.as_bytes());
        Ok(LockAttempt::Acquired(Box::new(LocalLock(file))))
    }
}

/// Atomically swaps two directories (Linux `renameat2(RENAME_EXCHANGE)`).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::{ffi::CString, os::unix::ffi::OsStrExt};
    let a = CString::new(a.as_os_str().as_bytes())?;
    let b = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both pointers are valid NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Atomic directory exchange is Linux-only; elsewhere replacement is refused.
#[cfg(not(target_os = "linux"))]
fn exchange(_a: &Path, _b: &Path) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "atomically replacing a published checkpoint needs Linux renameat2",
    ))
}

/// Creates directory `path` and its missing ancestors, then syncs the parent of each one it
/// created, so that a new checkpoint root survives a power cut with the checkpoints in it.
pub(crate) fn create_dir_all_durable(st: &dyn Storage, path: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(path);
    while let Some(p) = cur {
        if p.as_os_str().is_empty() || st.exists(p) {
            break;
        }
        missing.push(p);
        cur = p.parent();
    }
    st.create_dir_all(path)?;
    for p in missing.into_iter().rev() {
        if let Some(parent) = p.parent().filter(|q| !q.as_os_str().is_empty()) {
            crate::failpoints::durability_step!(FSYNC_ROOT_PARENT, st.sync_dir(parent))?;
        }
    }
    Ok(())
}
