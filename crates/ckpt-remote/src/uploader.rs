//! The background uploader: copies each checkpoint the local engine published to the object
//! store, one at a time, off the training thread.
//!
//! [`Uploader::submit`] hard-links the published files into `ROOT/.tmp-upload-*` first (free,
//! and published files are never modified), so local retention may delete the checkpoint while
//! its upload is still queued. Failures come back from the next [`Uploader::poll`] or from
//! [`Uploader::finish`], typed and naming the step and the object key, as persist failures do.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use crossbeam_channel::Sender;

use crate::{Completions, Error, Remote, Result, Uploaded};

struct Job {
    step: u64,
    staged: PathBuf,
}

/// Uploads published checkpoints in the background (see the module docs).
#[derive(Debug)]
pub struct Uploader {
    remote: Remote,
    jobs: Option<Sender<Job>>,
    done: Completions<Error>,
    worker: Option<JoinHandle<()>>,
    /// Set on drop without `finish`: queued uploads are abandoned, not waited for.
    cancel: Arc<AtomicBool>,
}

impl Uploader {
    /// Starts the uploader thread for `remote`.
    pub fn start(remote: Remote) -> Result<Self> {
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let r = remote.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = cancel.clone();
        let worker = std::thread::Builder::new()
            .name("ckpt-upload".into())
            .spawn(move || {
                for job in jobs_rx {
                    if cancelled.load(Ordering::Relaxed) {
                        let _ = std::fs::remove_dir_all(&job.staged);
                        continue;
                    }
                    let result = r.upload(&job.staged);
                    let _ = std::fs::remove_dir_all(&job.staged);
                    if let Err(e) = &result {
                        tracing::warn!(step = job.step, error = %e, "checkpoint upload failed");
                    }
                    if done_tx.send(result).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Gone(e.to_string()))?;
        Ok(Self {
            remote,
            jobs: Some(jobs_tx),
            done: Completions::new(done_rx),
            worker: Some(worker),
            cancel,
        })
    }

    /// The remote prefix.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    /// Uploads not finished yet.
    pub fn pending(&self) -> usize {
        self.done.pending()
    }

    /// Queues the published local checkpoint `dir` (of `step`) for upload.
    pub fn submit(&mut self, step: u64, dir: &Path) -> Result<()> {
        let staged = stage(step, dir, None, "")?;
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| Error::Gone("uploader already finished".into()))?;
        jobs.send(Job { step, staged })
            .map_err(|_| Error::Gone("the uploader thread is gone".into()))?;
        self.done.queued();
        Ok(())
    }

    fn collect(&mut self, block: bool) -> Result<Vec<Uploaded>> {
        self.done
            .collect(block, || Error::Gone("the uploader thread is gone".into()))
    }

    /// Uploads finished since the last call; the first failure, if any, as an error.
    pub fn poll(&mut self) -> Result<Vec<Uploaded>> {
        self.collect(false)
    }

    /// Waits for every queued upload; the first failure, if any, as an error.
    pub fn wait_idle(&mut self) -> Result<Vec<Uploaded>> {
        self.collect(true)
    }

    /// Waits for every queued upload and stops the thread. Returns every upload this uploader
    /// made; the first failure not yet returned, if any, as an error.
    pub fn finish(mut self) -> Result<Vec<Uploaded>> {
        let r = self.collect(true);
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        r.map(|_| self.done.take_all())
    }
}

/// Dropped without [`Uploader::finish`] (an error path, a stop whose grace period ran out):
/// queued uploads are abandoned and the upload under way is not waited for, so the process can
/// exit; what was not uploaded is logged.
impl Drop for Uploader {
    fn drop(&mut self) {
        if self.worker.is_none() {
            return;
        }
        self.cancel.store(true, Ordering::Relaxed);
        self.jobs = None;
        if self.pending() > 0 {
            tracing::warn!(
                pending = self.pending(),
                "checkpoint uploads abandoned: the uploader was dropped without finish"
            );
        }
    }
}

/// Hard-links the files of published checkpoint `dir` named by `names` (all of them when
/// `None`) into a sibling `ROOT/.tmp-upload-<step>-<pid><suffix>` directory (recovery removes it
/// if the run dies), falling back to a copy across file systems. Published files are never
/// modified, so the link is a stable copy while local retention deletes the original.
pub fn stage(step: u64, dir: &Path, names: Option<&[&str]>, suffix: &str) -> Result<PathBuf> {
    let local = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Local { step, path, source }
    };
    let root = dir.parent().unwrap_or(Path::new("."));
    let staged = root.join(format!(".tmp-upload-{step}-{}{suffix}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir(&staged).map_err(local(&staged))?;
    let all: Vec<std::ffi::OsString>;
    let names: Vec<&std::ffi::OsStr> = match names {
        Some(n) => n.iter().map(std::ffi::OsStr::new).collect(),
        None => {
            all = std::fs::read_dir(dir)
                .map_err(local(dir))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<std::io::Result<_>>()
                .map_err(local(dir))?;
            all.iter().map(|n| n.as_os_str()).collect()
        }
    };
    for name in names {
        let (from, to) = (dir.join(name), staged.join(name));
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(local(&from))?;
        }
    }
    Ok(staged)
}
