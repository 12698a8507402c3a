//! The publication protocol (`docs/design.md`): parts into `ROOT/.tmp-<step>-<nonce>/`, fsync each,
//! `manifest.json` last, fsync it and the directory, rename to `step-<step:08>`, fsync the root,
//! replace `latest` atomically, then retention. Any failure before `latest` moves removes what
//! was written, so a failed checkpoint publishes nothing.

use std::{
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::{
    Error, Manifest, Result, Retention, Snapshot, Stage, checksum,
    failpoints::{durability_step, io_failpoint},
    latest::{read_latest, write_latest},
    layout::{FORMAT_VERSION, FileEntry, MANIFEST_FILE},
    naming::{LATEST_FILE, TMP_PREFIX, checkpoint_dir_name, nonce},
    retention::apply_retention,
    snapshot::PartData,
    storage::{Storage, StoragePath},
};

const CHUNK: usize = 8 << 20;

/// What a successful persist produced.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub path: PathBuf,
    pub bytes: u64,
    pub persist: Duration,
    pub removed: Vec<u64>,
}

/// Publishes snapshots into one root. Shared by the persist thread and synchronous writes.
#[derive(Debug)]
pub(crate) struct Publisher {
    storage: Arc<dyn Storage>,
    root: PathBuf,
    retention: Retention,
    /// Serializes the commit (rename, `latest`, retention); holds the newest published step.
    commit: Mutex<Option<u64>>,
}

/// A sink that remembers the first I/O error, so a producer's failure can be told apart from
/// a failure of the disk underneath it.
struct ErrorMemo<W> {
    inner: W,
    first_error: Option<io::Error>,
}

impl<W: Write> Write for ErrorMemo<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| self.remember(e))
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().inspect_err(|e| self.remember(e))
    }
}

/// Gives a part's held bytes back as its bytes reach the file (for a part declared with
/// [`crate::Snapshot::holding_released_as_written`]).
struct Releasing<'a, W> {
    inner: W,
    guard: Option<&'a mut crate::held::HoldGuard>,
}

impl<W: Write> Write for Releasing<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(g) = self.guard.as_mut() {
            g.release(n as u64);
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W> ErrorMemo<W> {
    fn remember(&mut self, e: &io::Error) {
        if self.first_error.is_none() {
            self.first_error = Some(io::Error::new(e.kind(), e.to_string()));
        }
    }
}

impl Publisher {
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        root: PathBuf,
        retention: Retention,
        latest: Option<u64>,
    ) -> Self {
        Self {
            storage,
            root,
            retention,
            commit: Mutex::new(latest),
        }
    }

    /// Rewinds the root to `to` ([`crate::rewind`]) and lets later publications start from
    /// there. Call only with nothing in flight.
    pub(crate) fn rewind(&self, to: Option<u64>) -> Result<Vec<(u64, PathBuf)>> {
        let mut latest = self.commit.lock().unwrap_or_else(|e| e.into_inner());
        let moved = crate::rewind::rewind(&*self.storage, &self.root, to)?;
        if !moved.is_empty() {
            *latest = to;
        }
        Ok(moved)
    }

    /// Persists and publishes `snap`.
    pub(crate) fn persist(&self, snap: Snapshot) -> Result<Published> {
        snap.validate()?;
        let step = snap.step;
        let target = self.root.join(checkpoint_dir_name(step));
        let replace = snap.replace;
        let st = &*self.storage;
        if st.exists(&target) && !replace {
            return Err(Error::AlreadyPublished { step, path: target });
        }
        let start = Instant::now();
        let tmp = self.root.join(format!("{TMP_PREFIX}{step}-{}", nonce()));
        st.create_dir(&tmp).map_err(|source| Error::Persist {
            step,
            stage: Stage::CreateTmp,
            path: tmp.clone(),
            source,
        })?;
        let result = self.write_tmp(&tmp, snap);
        let manifest = match result {
            Ok(m) => m,
            Err(e) => {
                let _ = st.remove_dir_all(&tmp);
                return Err(e);
            }
        };
        let removed = self.commit(step, &tmp, &target, replace)?;
        Ok(Published {
            path: target,
            bytes: manifest.total_bytes(),
            persist: start.elapsed(),
            removed,
        })
    }

    fn write_tmp(&self, tmp: &Path, snap: Snapshot) -> Result<Manifest> {
        let step = snap.step;
        let st = &*self.storage;
        let mut files = Vec::with_capacity(snap.parts.len());
        for mut part in snap.parts {
            let path = tmp.join(&part.name);
            let persist_err = |stage, source| Error::Persist {
                step,
                stage,
                path: path.clone(),
                source,
            };
            if let PartData::Adopted(durable) = part.data {
                let adopted = (|| -> io::Result<u64> {
                    io_failpoint!(WRITE_PART);
                    st.rename(&durable.path, &path)?;
                    Ok(st.metadata(&path)?.len)
                })()
                .map_err(|e| persist_err(Stage::WritePart, e))?;
                if adopted != durable.size {
                    return Err(persist_err(
                        Stage::WritePart,
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "adopted file {} has {adopted} bytes, its writer reported {}",
                                durable.path.display(),
                                durable.size
                            ),
                        ),
                    ));
                }
                files.push(FileEntry {
                    name: part.name,
                    size: adopted,
                    xxh3: checksum::hex(durable.xxh3),
                });
                continue;
            }
            let (mut file, digest, size) = (|| -> Result<_> {
                let create = || -> io::Result<Box<dyn crate::storage::WriteFile>> {
                    io_failpoint!(WRITE_PART);
                    st.create_file(&path)
                };
                let file = create().map_err(|e| persist_err(Stage::WritePart, e))?;
                let mut w = crate::checksum::HashingWriter::new(file);
                match part.data {
                    PartData::Bytes(b) => write_chunked(&mut w, &b),
                    PartData::Shared(b) => write_chunked(&mut w, &b),
                    PartData::Adopted(_) => {
                        Err(io::Error::other("adopted part reached the writer"))
                    }
                    PartData::Producer(p) => {
                        let guard = part.guard.as_mut().filter(|_| part.released_as_written);
                        let mut sink = ErrorMemo {
                            inner: BufWriter::with_capacity(
                                CHUNK,
                                Releasing {
                                    inner: &mut w,
                                    guard,
                                },
                            ),
                            first_error: None,
                        };
                        let produced = p.write_into(&mut sink);
                        let flushed = sink.flush();
                        match (produced, sink.first_error.take(), flushed) {
                            (_, Some(io), _) => Err(io),
                            (Err(source), None, _) => {
                                return Err(Error::Producer {
                                    step,
                                    part: part.name.clone(),
                                    source,
                                });
                            }
                            (Ok(()), None, r) => r,
                        }
                    }
                }
                .map_err(|e| persist_err(Stage::WritePart, e))?;
                Ok(w.finish())
            })()?;
            (|| -> io::Result<()> {
                io_failpoint!(FSYNC_PART);
                durability_step!(FSYNC_PART, file.sync())
            })()
            .map_err(|e| persist_err(Stage::FsyncPart, e))?;
            files.push(FileEntry {
                name: part.name,
                size,
                xxh3: checksum::hex(digest),
            });
        }
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            step,
            epoch: snap.epoch,
            world_size: snap.world_size,
            layout: snap.layout,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            files,
            meta: snap.meta,
        };
        let mpath = tmp.join(MANIFEST_FILE);
        let merr = |stage, source| Error::Persist {
            step,
            stage,
            path: mpath.clone(),
            source,
        };
        let mut mfile = (|| -> io::Result<Box<dyn crate::storage::WriteFile>> {
            io_failpoint!(WRITE_MANIFEST);
            let mut f = st.create_file(&mpath)?;
            f.write_all(&manifest.to_bytes())?;
            Ok(f)
        })()
        .map_err(|e| merr(Stage::WriteManifest, e))?;
        (|| -> io::Result<()> {
            io_failpoint!(FSYNC_MANIFEST);
            durability_step!(FSYNC_MANIFEST, mfile.sync())
        })()
        .map_err(|e| merr(Stage::FsyncManifest, e))?;
        (|| -> io::Result<()> {
            io_failpoint!(FSYNC_TMP_DIR);
            durability_step!(FSYNC_TMP_DIR, st.sync_dir(tmp))
        })()
        .map_err(|source| Error::Persist {
            step,
            stage: Stage::FsyncTmpDir,
            path: tmp.to_path_buf(),
            source,
        })?;
        Ok(manifest)
    }

    /// Rename, fsync root, move `latest`, retention. On failure before `latest` is durable the
    /// directory is taken back out of the published namespace. With `replace`, an existing
    /// `step-*` directory is swapped with the new one in one atomic exchange, so a valid copy of
    /// the step exists at every instant; the old copy is then removed.
    fn commit(&self, step: u64, tmp: &Path, target: &Path, replace: bool) -> Result<Vec<u64>> {
        let mut latest = self.commit.lock().unwrap_or_else(|e| e.into_inner());
        let root = self.root.as_path();
        let st = &*self.storage;
        let exchanged = replace && st.exists(target);
        let renamed = (|| -> io::Result<()> {
            io_failpoint!(RENAME);
            if exchanged {
                return st.exchange(tmp, target);
            }
            if st.exists(target) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "target directory exists",
                ));
            }
            st.rename(tmp, target)
        })();
        if let Err(source) = renamed {
            let _ = st.remove_dir_all(tmp);
            return Err(Error::Persist {
                step,
                stage: Stage::Rename,
                path: target.to_path_buf(),
                source,
            });
        }
        let synced = (|| -> io::Result<()> {
            io_failpoint!(FSYNC_ROOT);
            durability_step!(FSYNC_ROOT, st.sync_dir(root))
        })();
        if let Err(source) = synced {
            if exchanged {
                // Put the old copy back; `tmp` then holds the new one, removed below.
                let _ = st.exchange(tmp, target);
                let _ = st.remove_dir_all(tmp);
            } else {
                self.unpublish(target, None);
            }
            return Err(Error::Persist {
                step,
                stage: Stage::FsyncRoot,
                path: root.to_path_buf(),
                source,
            });
        }
        if exchanged {
            // Best effort: start-up recovery removes it if this fails or we crash first.
            let _ = st.remove_dir_all(tmp);
        }
        if latest.is_none_or(|l| step > l) {
            if let Err(source) = write_latest(st, root, &checkpoint_dir_name(step)) {
                self.unpublish(target, Some(*latest));
                return Err(Error::Persist {
                    step,
                    stage: Stage::UpdateLatest,
                    path: root.join(LATEST_FILE),
                    source,
                });
            }
            *latest = Some(step);
        }
        apply_retention(st, root, &self.retention, step)
    }

    /// Best effort: removes a just-renamed directory and, if `latest` already names it, points
    /// `latest` back at `previous`.
    fn unpublish(&self, target: &Path, previous: Option<Option<u64>>) {
        let root = self.root.as_path();
        let st = &*self.storage;
        if let Some(prev) = previous {
            let name = target
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if read_latest(StoragePath::new(st, root))
                .ok()
                .flatten()
                .as_deref()
                == Some(name)
            {
                let _ = match prev {
                    Some(p) => write_latest(st, root, &checkpoint_dir_name(p)),
                    None => st.remove_file(&root.join(LATEST_FILE)),
                };
            }
        }
        let doomed = root.join(format!("{TMP_PREFIX}failed-{}", nonce()));
        if st.rename(target, &doomed).is_ok() {
            let _ = st.sync_dir(root);
            let _ = st.remove_dir_all(&doomed);
        }
    }
}

fn write_chunked(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    for c in bytes.chunks(CHUNK) {
        w.write_all(c)?;
    }
    w.flush()
}
