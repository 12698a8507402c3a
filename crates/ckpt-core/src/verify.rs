//! Verification: reading a checkpoint's manifest and checking its files against it, the whole
//! directory at once ([`verify_checkpoint`], [`verify_root`]) or one part at a time while
//! reading it ([`Manifest::read_part_into`], [`Manifest::verify_part`]). Errors name the
//! offending file.

use std::path::Path;

use crate::{
    Error, Manifest, Result, checksum,
    layout::{FileEntry, MANIFEST_FILE},
    naming::parse_step_dir,
    storage::{LocalDisk, ReadFile, Storage, StoragePath},
};

/// Bytes read (and hashed) per step of a verified read: large enough for few system calls,
/// small enough that the chunk is still in cache when it is hashed.
const VERIFY_CHUNK: usize = 1 << 20;

/// How much of a checkpoint [`check_checkpoint`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Depth {
    /// The manifest and every listed file's size; no file is read.
    Sizes,
    /// Also every listed file's contents against its checksum.
    Full,
}

/// Reads and checks (self-checksum, format) the manifest of a checkpoint directory, without
/// reading the files it lists.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage.
pub fn read_manifest<'a>(at: impl Into<StoragePath<'a>>) -> Result<Manifest> {
    let StoragePath {
        storage: st,
        path: dir,
    } = at.into();
    let path = dir.join(MANIFEST_FILE);
    let bytes = st.read(&path).map_err(|e| {
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

/// The one check of a checkpoint directory against its manifest, which every other check of a
/// whole checkpoint calls: reads the manifest ([`read_manifest`]), checks every listed file's
/// size, and with [`Depth::Full`] then every file's checksum. Returns the manifest.
pub(crate) fn check_checkpoint(st: &dyn Storage, dir: &Path, depth: Depth) -> Result<Manifest> {
    let m = read_manifest(StoragePath::new(st, dir))?;
    for f in &m.files {
        let p = dir.join(&f.name);
        let len = st
            .metadata(&p)
            .map_err(|e| Error::corrupt(&p, format!("listed in the manifest but unreadable: {e}")))?
            .len;
        if len != f.size {
            return Err(size_mismatch(&p, len, f.size));
        }
    }
    if depth == Depth::Full {
        for f in &m.files {
            verify_file(st, &dir.join(&f.name), f)?;
        }
    }
    Ok(m)
}

/// Fully verifies one checkpoint directory: manifest self-checksum, every file's size
/// and checksum. Errors name the offending file.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage.
///
/// ```no_run
/// let manifest = ckpt_core::verify_checkpoint("runs/x/ckpt/step-00000100")?;
/// println!("step {} epoch {}: {} files", manifest.step, manifest.epoch, manifest.files.len());
/// # Ok::<(), ckpt_core::Error>(())
/// ```
pub fn verify_checkpoint<'a>(at: impl Into<StoragePath<'a>>) -> Result<Manifest> {
    let StoragePath {
        storage: st,
        path: dir,
    } = at.into();
    check_checkpoint(st, dir, Depth::Full)
}

/// Reads one part of a checkpoint and checks it against the manifest.
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage.
pub fn read_part<'a>(at: impl Into<StoragePath<'a>>, name: &str) -> Result<Vec<u8>> {
    let StoragePath {
        storage: st,
        path: dir,
    } = at.into();
    read_manifest(StoragePath::new(st, dir))?.read_part_into(
        StoragePath::new(st, dir),
        name,
        |size| vec![0u8; size],
    )
}

impl Manifest {
    /// Reads part `name` of checkpoint `dir` (the directory this manifest was read from) into
    /// the buffer `alloc(size)` returns, `size` being the manifest's size for the part, and
    /// checks it while reading: the file is read once, in cache-sized chunks, each hashed
    /// (XXH3) right after it is read. The buffer must hold at least `size` bytes; its first
    /// `size` bytes are filled and the rest is left as `alloc` made it. Errors name the file: a
    /// part the manifest does not list, a missing file, a size or checksum that differs
    /// ([`Error::Corrupt`]), or an I/O error ([`Error::Io`]).
    ///
    /// `at` is the directory on the local disk, or a [`StoragePath`] on another storage.
    pub fn read_part_into<'a, B>(
        &self,
        at: impl Into<StoragePath<'a>>,
        name: &str,
        alloc: impl FnOnce(usize) -> B,
    ) -> Result<B>
    where
        B: std::ops::DerefMut<Target = [u8]>,
    {
        let StoragePath {
            storage: st,
            path: dir,
        } = at.into();
        let p = dir.join(name);
        let entry = listed(self, &p, name)?;
        let mut file = open_listed(st, &p)?;
        // Checked before allocating, so a file of the wrong size costs no buffer.
        let len = file.len().map_err(|e| Error::io(&p, e))?;
        if len != entry.size {
            return Err(size_mismatch(&p, len, entry.size));
        }
        let size = usize::try_from(entry.size).map_err(|_| size_mismatch(&p, len, entry.size))?;
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
            checksum::Filled::Short(n) => return Err(size_mismatch(&p, n as u64, entry.size)),
            checksum::Filled::Longer => {
                let now = file.len().unwrap_or(entry.size + 1);
                return Err(size_mismatch(&p, now.max(entry.size + 1), entry.size));
            }
        };
        check_digest(&p, entry, digest)?;
        Ok(buf)
    }

    /// Checks part `name` of checkpoint `dir` (the directory this manifest was read from)
    /// against this manifest without keeping its bytes: size and checksum, streamed. The
    /// errors are those of [`Manifest::read_part_into`].
    pub fn verify_part(&self, dir: &Path, name: &str) -> Result<()> {
        let p = dir.join(name);
        verify_file(&LocalDisk, &p, listed(self, &p, name)?)
    }
}

/// The manifest's entry for part `name`, whose file is `p`.
fn listed<'m>(m: &'m Manifest, p: &Path, name: &str) -> Result<&'m FileEntry> {
    m.file(name)
        .ok_or_else(|| Error::corrupt(p, "not listed in the checkpoint's manifest"))
}

/// Opens listed file `p`; a missing file is corruption, not an I/O error.
fn open_listed(st: &dyn Storage, p: &Path) -> Result<Box<dyn ReadFile>> {
    st.open(p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::corrupt(p, "file is missing")
        } else {
            Error::io(p, e)
        }
    })
}

/// Size and checksum of one file against its manifest entry, streamed.
fn verify_file(st: &dyn Storage, p: &Path, f: &FileEntry) -> Result<()> {
    let (digest, len) = checksum::of_reader(open_listed(st, p)?).map_err(|e| Error::io(p, e))?;
    if len != f.size {
        return Err(size_mismatch(p, len, f.size));
    }
    check_digest(p, f, digest)
}

/// File `p` has `len` bytes where its manifest entry says `expected`.
fn size_mismatch(p: &Path, len: u64, expected: u64) -> Error {
    Error::corrupt(
        p,
        format!("size {len} differs from the manifest's {expected}"),
    )
}

/// The XXH3 `digest` of file `p` against its manifest entry.
fn check_digest(p: &Path, f: &FileEntry, digest: u64) -> Result<()> {
    let hex = checksum::hex(digest);
    if hex != f.xxh3 {
        return Err(Error::corrupt(
            p,
            format!("checksum mismatch (manifest {}, file {hex})", f.xxh3),
        ));
    }
    Ok(())
}
