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

use crossbeam_channel::{Receiver, Sender};

use crate::{Error, Remote, Result, Uploaded};

struct Job {
    step: u64,
    staged: PathBuf,
}

/// Uploads published checkpoints in the background (see the module docs).
#[derive(Debug)]
pub struct Uploader {
    remote: Remote,
    jobs: Option<Sender<Job>>,
    done: Receiver<Result<Uploaded>>,
    worker: Option<JoinHandle<()>>,
    queued: usize,
    uploaded: Vec<Uploaded>,
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
            done: done_rx,
            worker: Some(worker),
            queued: 0,
            uploaded: Vec::new(),
            cancel,
        })
    }

    /// The remote prefix.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    /// Uploads not finished yet.
    pub fn pending(&self) -> usize {
        self.queued
    }

    /// Queues the published local checkpoint `dir` (of `step`) for upload.
    pub fn submit(&mut self, step: u64, dir: &Path) -> Result<()> {
        let staged = stage(step, dir)?;
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| Error::Gone("uploader already finished".into()))?;
        jobs.send(Job { step, staged })
            .map_err(|_| Error::Gone("the uploader thread is gone".into()))?;
        self.queued += 1;
        Ok(())
    }

    fn collect(&mut self, block: bool) -> Result<Vec<Uploaded>> {
        let mut out = Vec::new();
        let mut first_err = None;
        loop {
            let next = if block && self.queued > 0 {
                self.done.recv().ok()
            } else {
                self.done.try_recv().ok()
            };
            let Some(r) = next else { break };
            self.queued = self.queued.saturating_sub(1);
            match r {
                Ok(u) => out.push(u),
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some(e);
                    }
                    if !block {
                        break;
                    }
                }
            }
        }
        self.uploaded.extend(out.iter().cloned());
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
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
        r.map(|_| std::mem::take(&mut self.uploaded))
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
        if self.queued > 0 {
            tracing::warn!(
                pending = self.queued,
                "checkpoint uploads abandoned: the uploader was dropped without finish"
            );
        }
    }
}

/// Hard-links the files of published checkpoint `dir` into a sibling `.tmp-upload-*`
/// directory (recovery removes it if the run dies), falling back to a copy across file
/// systems.
fn stage(step: u64, dir: &Path) -> Result<PathBuf> {
    let local = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Local { step, path, source }
    };
    let root = dir.parent().unwrap_or(Path::new("."));
    let staged = root.join(format!(".tmp-upload-{step}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir(&staged).map_err(local(&staged))?;
    for ent in std::fs::read_dir(dir).map_err(local(dir))? {
        let ent = ent.map_err(local(dir))?;
        let to = staged.join(ent.file_name());
        if std::fs::hard_link(ent.path(), &to).is_err() {
            std::fs::copy(ent.path(), &to).map_err(local(&ent.path()))?;
        }
    }
    Ok(staged)
}
