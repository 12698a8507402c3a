//! Sharded checkpoints to an object store (feature `remote`): every rank uploads its own part
//! of each published checkpoint, and rank 0 publishes it remotely once every part is there.
//!
//! A rank's part is what it wrote: rank `r` uploads its optimizer shard
//! `optim.rank-<r>-of-<n>.bpk` (per-rank layout), rank 0 everything else (model, scheduler,
//! trainer state, a consolidated `optim.bpk`). Each rank's uploads run on its own background
//! thread over a dedicated upload group (never the training or the checkpoint group), one
//! checkpoint at a time, in step order, with `ckpt_remote`'s protocol split between ranks:
//!
//! 1. rank 0 compares the step with the remote copy ([`Remote::begin_upload`]: absent,
//!    identical, or replaced, whose manifest goes first) and broadcasts the plan;
//! 2. every rank uploads its part ([`Remote::upload_parts`]), checksummed against the local
//!    manifest as it is read, and reports the outcome to rank 0;
//! 3. only when every rank reported success, rank 0 checks every part is in the store with its
//!    size and writes the manifest, the commit point ([`Remote::commit_upload`]), then moves
//!    `latest` by conditional put and applies remote retention;
//! 4. all ranks agree on the outcome, so a failure on any rank is a failure on every rank,
//!    naming the step and the rank and object key at fault. Nothing of that step is published
//!    remotely: parts without a manifest are garbage for `ckpt gc URL`.
//!
//! The files are staged by hard link (`ROOT/.tmp-upload-*`, which start-up recovery removes)
//! on the checkpoint thread right after publication ([`crate::checkpoint::AfterPublish`]), so
//! local retention may delete the checkpoint while its upload is still queued.

use std::{
    path::{Path, PathBuf},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use ckpt_remote::{Completions, Remote, UploadPlan, Uploaded};
use crossbeam_channel::Sender;
use serde::{Deserialize, Serialize};

use crate::checkpoint::AfterPublish;
use crate::collective::Collective;
use crate::shards::parse_shard_file_name;
use crate::{Error, Result};

/// Failpoint (feature `failpoints`): the rank whose number is the failpoint's argument skips
/// uploading its part but reports success, as a buggy rank would; rank 0's check that every
/// part is in the store must then refuse to publish.
#[cfg(feature = "failpoints")]
pub const FP_SKIP_PART: &str = "zero_upload_skip_part";
#[cfg(not(feature = "failpoints"))]
#[allow(dead_code)]
const FP_SKIP_PART: &str = "zero_upload_skip_part";

/// The shortest deadline of the upload group's collective calls: rank 0 waits in them while
/// the other ranks upload.
pub const MIN_UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// A checkpoint staged for upload: this rank's share of its files, hard-linked.
struct Job {
    step: u64,
    staged: std::result::Result<(PathBuf, Vec<String>), String>,
}

/// What a rank tells rank 0 after uploading its part.
#[derive(Serialize, Deserialize)]
enum PartReport {
    Uploaded(u64),
    Failed(String),
}

/// Rank 0's plan for a step, broadcast to every rank.
#[derive(Serialize, Deserialize)]
enum Plan {
    Parts,
    AlreadyThere,
    Failed(String),
}

/// One rank's uploader of sharded checkpoints (see the module docs).
pub struct ShardUploader {
    rank: usize,
    remote: Remote,
    jobs: Sender<Job>,
    done: Completions<Error>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ShardUploader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardUploader")
            .field("rank", &self.rank)
            .field("remote", &self.remote.url())
            .finish()
    }
}

impl ShardUploader {
    /// Starts this rank's upload thread. `group` must be a group of its own (split from the
    /// training group in the same order on every rank); its deadline is raised to at least
    /// [`MIN_UPLOAD_TIMEOUT`], since rank 0 waits in it while the others upload.
    pub fn start(mut group: Box<dyn Collective>, remote: Remote) -> Result<Self> {
        let rank = group.rank();
        group.set_timeout(group.timeout().max(MIN_UPLOAD_TIMEOUT));
        let (jobs, rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done) = crossbeam_channel::unbounded();
        let r = remote.clone();
        let worker = std::thread::Builder::new()
            .name(format!("ckpt-zero-upload-{rank}"))
            .spawn(move || {
                for job in rx {
                    let result = upload_one(group.as_mut(), &r, &job);
                    if let Ok((dir, _)) = &job.staged {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                    if let Err(e) = &result {
                        tracing::warn!(rank, step = job.step, error = %e, "checkpoint upload failed");
                    }
                    // A collective failure leaves the ranks out of step: no later upload.
                    let go_on = !matches!(result, Err(Error::Collective(_)));
                    if done_tx.send(result).is_err() || !go_on {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Rank {
                rank,
                reason: format!("cannot start the upload thread: {e}"),
            })?;
        Ok(Self {
            rank,
            remote,
            jobs,
            done: Completions::new(done),
            worker: Some(worker),
        })
    }

    /// The remote prefix.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    /// Uploads queued and not finished.
    pub fn pending(&self) -> usize {
        self.done.pending()
    }

    /// The hook for [`crate::ShardedSaver::start_with`]: stages this rank's share of every
    /// published checkpoint and queues its upload.
    pub fn after_publish(&self) -> AfterPublish {
        let jobs = self.jobs.clone();
        let rank = self.rank;
        let queued = self.done.counter();
        Box::new(move |step, dir| {
            let staged = stage_share(step, dir, rank);
            queued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if jobs.send(Job { step, staged }).is_err() {
                queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    }

    fn collect(&mut self, block: bool) -> Result<Vec<Uploaded>> {
        // The thread stops after a collective failure it already reported, or vanished.
        let rank = self.rank;
        self.done.collect(block, || Error::Rank {
            rank,
            reason: "the upload thread is gone".into(),
        })
    }

    /// Uploads finished since the last call; the first failure, if any, as an error.
    pub fn poll(&mut self) -> Result<Vec<Uploaded>> {
        self.collect(false)
    }

    /// Waits for every queued upload and stops the thread. Returns every upload this rank
    /// made (rank 0's cover whole checkpoints); the first failure not yet returned, if any,
    /// as an error. Call it after the saver is closed, so no more uploads are queued.
    pub fn finish(mut self) -> Result<Vec<Uploaded>> {
        let r = self.collect(true);
        let (dead, _) = crossbeam_channel::unbounded();
        drop(std::mem::replace(&mut self.jobs, dead));
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        r.map(|_| self.done.take_all())
    }
}

impl Drop for ShardUploader {
    /// Dropped without [`ShardUploader::finish`] (an error path): queued uploads are not
    /// waited for, so the process can exit; the thread ends with its channel.
    fn drop(&mut self) {
        if self.worker.is_some() && self.pending() > 0 {
            tracing::warn!(
                rank = self.rank,
                pending = self.pending(),
                "checkpoint uploads abandoned: the uploader was dropped without finish"
            );
        }
    }
}

/// The names of `dir`'s parts that `rank` uploads: its own shard files; rank 0 also every
/// file that is no rank's shard.
fn share(names: impl IntoIterator<Item = String>, rank: usize) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| match parse_shard_file_name(n) {
            Some((r, _)) => r == rank,
            None => rank == 0,
        })
        .collect()
}

/// Hard-links `rank`'s share of published checkpoint `dir`, with its manifest, into
/// `ROOT/.tmp-upload-<step>-<pid>-rank<r>`.
fn stage_share(
    step: u64,
    dir: &Path,
    rank: usize,
) -> std::result::Result<(PathBuf, Vec<String>), String> {
    let m = ckpt_core::read_manifest(dir)
        .map_err(|e| format!("step {step}: staging for upload: {e}"))?;
    let names = share(m.files.into_iter().map(|f| f.name), rank);
    let linked: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .chain([ckpt_core::layout::MANIFEST_FILE])
        .collect();
    let staged = ckpt_remote::stage(step, dir, Some(&linked), &format!("-rank{rank}"))
        .map_err(|e| e.to_string())?;
    Ok((staged, names))
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(v, bincode::config::standard())
        .map_err(|e| Error::Config(e.to_string()))
}

fn decode<T: for<'de> Deserialize<'de>>(b: &[u8], what: &str) -> Result<T> {
    bincode::serde::decode_from_slice(b, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| Error::Config(format!("undecodable {what}: {e}")))
}

/// One checkpoint's upload on this rank: the collective protocol of the module docs.
fn upload_one(g: &mut dyn Collective, remote: &Remote, job: &Job) -> Result<Uploaded> {
    let t0 = Instant::now();
    let (rank, world, step) = (g.rank(), g.size(), job.step);
    // 1. Rank 0 plans; rank 0's own typed error is kept for its result.
    let mut own_err: Option<Error> = None;
    let mut msg = if rank == 0 {
        let plan = match &job.staged {
            Ok((dir, _)) => match remote.begin_upload(dir) {
                Ok(UploadPlan::Parts) => Plan::Parts,
                Ok(UploadPlan::AlreadyThere) => Plan::AlreadyThere,
                Err(e) => {
                    let p = Plan::Failed(e.to_string());
                    own_err = Some(e.into());
                    p
                }
            },
            Err(reason) => Plan::Failed(reason.clone()),
        };
        encode(&plan)?
    } else {
        Vec::new()
    };
    g.broadcast(0, &mut msg)?;
    let plan: Plan = decode(&msg, "upload plan")?;

    // 2. Every rank uploads its part.
    let mine = match (&plan, &job.staged) {
        (Plan::Failed(reason), _) => Err(Error::UploadNotPublished {
            step,
            reason: format!("rank 0: {reason}"),
        }),
        (Plan::AlreadyThere, _) => Ok(0),
        (Plan::Parts, Err(reason)) => Err(Error::UploadNotPublished {
            step,
            reason: format!("rank {rank}: {reason}"),
        }),
        (Plan::Parts, Ok((dir, names))) => {
            let skip = skip_part(rank);
            if skip {
                Ok(0)
            } else {
                remote
                    .upload_parts(dir, names.iter().map(String::as_str))
                    .map_err(Error::from)
            }
        }
    };
    let report = match &mine {
        Ok(n) => PartReport::Uploaded(*n),
        Err(e) => PartReport::Failed(e.to_string()),
    };

    // 3. Rank 0 publishes once every rank's part is up.
    let local: Result<Uploaded> = match g.gather(0, &encode(&report)?)? {
        Some(reports) => {
            let mut bytes = 0;
            let mut failed = None;
            for (r, m) in reports.iter().enumerate() {
                match decode::<PartReport>(m, "upload report")? {
                    PartReport::Uploaded(n) => bytes += n,
                    PartReport::Failed(reason) if failed.is_none() => {
                        failed = Some((r, reason));
                    }
                    PartReport::Failed(_) => {}
                }
            }
            match (own_err.take(), mine, failed) {
                (Some(e), _, _) => Err(e),
                (None, Err(e), _) => Err(e),
                (None, Ok(_), Some((r, reason))) => Err(Error::UploadNotPublished {
                    step,
                    reason: format!("rank {r} of {world}: {reason}"),
                }),
                (None, Ok(_), None) => match &job.staged {
                    Ok((dir, _)) => {
                        let plan = match plan {
                            Plan::AlreadyThere => UploadPlan::AlreadyThere,
                            _ => UploadPlan::Parts,
                        };
                        remote
                            .commit_upload(dir, plan, bytes, t0)
                            .map_err(Error::from)
                    }
                    Err(reason) => Err(Error::UploadNotPublished {
                        step,
                        reason: reason.clone(),
                    }),
                },
            }
        }
        None => mine.map(|bytes| Uploaded {
            step,
            bytes,
            elapsed: t0.elapsed(),
            latest: false,
            removed: Vec::new(),
        }),
    };

    // 4. Every rank learns the outcome.
    let agreed = g.all_agree(local.is_ok())?;
    match (local, agreed) {
        (Ok(u), true) => Ok(u),
        (Err(e), _) => Err(e),
        (Ok(_), false) => Err(Error::UploadNotPublished {
            step,
            reason: "another rank's upload failed (rank 0 reports which)".into(),
        }),
    }
}

/// Whether the [`FP_SKIP_PART`] failpoint tells this rank to skip its upload.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
fn skip_part(rank: usize) -> bool {
    fail::fail_point!(FP_SKIP_PART, |arg| {
        arg.and_then(|a| a.parse::<usize>().ok()) == Some(rank)
    });
    false
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn each_rank_uploads_its_own_shard_and_rank_0_the_rest() {
        let names = [
            "model.bpk",
            "optim.rank-0-of-2.bpk",
            "optim.rank-1-of-2.bpk",
            "scheduler.bin",
        ]
        .map(String::from);
        assert_eq!(
            share(names.clone(), 0),
            ["model.bpk", "optim.rank-0-of-2.bpk", "scheduler.bin"]
        );
        assert_eq!(share(names.clone(), 1), ["optim.rank-1-of-2.bpk"]);
        assert!(share(["model.bpk".to_string()], 1).is_empty());
    }
}
