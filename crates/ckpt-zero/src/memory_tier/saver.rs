//! A rank's memory-tier thread: publishes the rank's part of a step in its node-local tier,
//! exchanges replicas with its peers over the tier's own collective group, and agrees on the
//! outcome with the other ranks.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use burn::module::Module;
use ckpt_burn::{SCHEDULER_FILE, TRAINER_FILE, encode_scheduler};
use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::{
    MemoryTier, SavePhases, missing_frame, open_root, part_snapshot, publish_frame,
    read_frame_or_missing, root_bytes,
};
use crate::checkpoint::Job;
use crate::collective::Collective;
use crate::shards::shard_file_name;
use crate::{Error, MemoryTierReport, Result, ShardJob};

/// What one memory save did on this rank.
enum Outcome {
    /// Every rank published its part and its replicas.
    Whole {
        step: u64,
        ms: f64,
        phases: SavePhases,
        held: u64,
    },
    /// Some rank's part or replica is missing (this rank's reason, or "another rank").
    Partial { step: u64, reason: String },
    /// The tier's group failed: the tier is off for the rest of the run.
    Broken { step: u64, reason: String },
}

/// A rank's memory-tier thread (see the module docs).
pub(crate) struct TierSaver<M> {
    tx: Option<Sender<Job<M>>>,
    done: Receiver<Outcome>,
    thread: Option<JoinHandle<()>>,
    in_flight: usize,
    broken: bool,
    report: MemoryTierReport,
}

struct Worker {
    group: Box<dyn Collective>,
    tier: MemoryTier,
    run: String,
    own: ckpt_core::Engine,
    own_root: PathBuf,
    /// (rank whose part, its replica root's engine), one per replica.
    replicas: Vec<(usize, ckpt_core::Engine)>,
}

impl<M: Module + 'static> TierSaver<M> {
    /// Opens this rank's tier roots (own part and one per replica it keeps) and starts the
    /// thread on `group`, the tier's own collective group.
    pub(crate) fn start(group: Box<dyn Collective>, tier: MemoryTier, run: String) -> Result<Self> {
        let (rank, world) = (group.rank(), group.size());
        let own_root = tier.own_root(rank, world, &run);
        let own = open_root(&own_root, tier.keep)?;
        let replicas = (1..=tier.replicas)
            .map(|k| {
                let of = tier.source(rank, k, world);
                open_root(&tier.replica_root(rank, of, world, &run), tier.keep).map(|e| (of, e))
            })
            .collect::<Result<Vec<_>>>()?;
        let (tx, rx) = crossbeam_channel::bounded::<Job<M>>(1);
        let (done_tx, done) = crossbeam_channel::unbounded();
        let mut worker = Worker {
            group,
            tier,
            run,
            own,
            own_root,
            replicas,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ckpt-memory-tier-{rank}"))
            .spawn(move || {
                ckpt_core::priority::lower_current_thread(ckpt_core::EngineConfig::PERSIST_NICE);
                for job in rx {
                    let out = worker.save(job);
                    let broken = matches!(out, Outcome::Broken { .. });
                    if done_tx.send(out).is_err() || broken {
                        break;
                    }
                }
                worker.close();
            })
            .map_err(|e| Error::Rank {
                rank,
                reason: format!("cannot start the memory-tier thread: {e}"),
            })?;
        Ok(Self {
            tx: Some(tx),
            done,
            thread: Some(thread),
            in_flight: 0,
            broken: false,
            report: MemoryTierReport::default(),
        })
    }

    /// Whether a memory save cannot be taken now: the previous one is still running, or the
    /// tier is off after its group failed.
    pub(crate) fn busy(&mut self) -> bool {
        self.drain(false);
        self.broken || self.in_flight > 0
    }

    /// Hands step's part to the thread (call only when no rank is [`Self::busy`]).
    pub(crate) fn submit(&mut self, job: Job<M>) {
        let Some(tx) = &self.tx else { return };
        if tx.send(job).is_ok() {
            self.in_flight += 1;
        } else {
            self.broken = true;
        }
    }

    /// Waits for the running save (see [`super::FP_MEMORY_TIER_WAIT`]).
    #[cfg(feature = "failpoints")]
    pub(crate) fn wait(&mut self) {
        self.drain(true);
    }

    /// A memory save every rank skipped because some rank's previous one was running (not
    /// counted once this rank's tier is off: nothing runs).
    pub(crate) fn skipped(&mut self, step: u64) {
        if self.broken {
            return;
        }
        self.report.skipped += 1;
        tracing::debug!(
            step,
            "memory-tier save skipped: a previous one is still running"
        );
    }

    /// A memory save skipped to keep within the overhead budget (or to measure a clean step).
    pub(crate) fn throttled(&mut self, step: u64) {
        self.report.throttled += 1;
        tracing::debug!(step, "memory-tier save skipped: overhead budget");
    }

    /// Takes finished outcomes into the report (waiting for all with `wait`).
    fn drain(&mut self, wait: bool) {
        while self.in_flight > 0 {
            let out = if wait {
                match self.done.recv() {
                    Ok(o) => o,
                    Err(_) => break,
                }
            } else {
                match self.done.try_recv() {
                    Ok(o) => o,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            self.in_flight -= 1;
            let r = &mut self.report;
            match out {
                Outcome::Whole {
                    step,
                    ms,
                    phases,
                    held,
                } => {
                    r.saved.push(step);
                    r.save_ms.push(ms);
                    r.phases.push(phases);
                    r.peak_bytes = r.peak_bytes.max(held);
                }
                Outcome::Partial { step, reason } => {
                    r.failed += 1;
                    tracing::warn!(step, %reason,
                        "memory-tier save is not whole on every rank; the next one may be");
                }
                Outcome::Broken { step, reason } => {
                    r.failed += 1;
                    self.broken = true;
                    tracing::error!(step, %reason,
                        "memory tier off for the rest of the run: its collective group failed \
                         (disk saves go on)");
                }
            }
        }
        if self.in_flight > 0 && self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            self.in_flight = 0;
            self.broken = true;
        }
    }

    /// Waits for the running save, stops the thread and returns what the tier did.
    pub(crate) fn finish(mut self) -> MemoryTierReport {
        self.drain(true);
        self.tx = None;
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the memory-tier thread panicked");
            self.broken = true;
        }
        let mut report = std::mem::take(&mut self.report);
        report.off = self.broken;
        report
    }
}

impl<M> Drop for TierSaver<M> {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Worker {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    /// One memory save: own part, replicas, agreement.
    fn save<M: Module + 'static>(&mut self, job: Job<M>) -> Outcome {
        let step = job.step();
        let t0 = Instant::now();
        // A panic while writing the part (a bug in capture or encoding) fails this save like
        // an error does: the thread goes on to the exchange, so no peer waits for a thread
        // that is gone (under MPI nothing would tell it).
        let own = match crate::caught::catch(|| job.build().and_then(|j| self.publish_own(j))) {
            Ok(r) => r,
            Err(panic) => Err(Error::Tier {
                path: self.own_root.clone(),
                reason: format!(
                    "rank {}'s memory-tier thread panicked writing its part of step {step}: \
                     {panic}",
                    self.rank()
                ),
            }),
        };
        let mut reason = own.as_ref().err().map(|e| e.to_string());
        let own_dir = self
            .own_root
            .join(ckpt_core::layout::checkpoint_dir_name(step));
        let world = self.group.size();
        let rank = self.rank();
        let t_own = t0.elapsed();
        // Read once (checked against its manifest as it is read), sent to every peer.
        let sent = match &own {
            Ok(_) => read_frame_or_missing(&own_dir),
            Err(e) => missing_frame(&e.to_string()),
        };
        let sent = match sent {
            Ok(b) => b,
            Err(e) => return broken(step, e),
        };
        let t_read = t0.elapsed();
        #[cfg(feature = "failpoints")]
        if let Some(Some(at)) = fail::eval(super::FP_MEMORY_TIER_DIE, |arg| arg)
            && at == format!("{rank}@{step}")
        {
            panic!(
                "failpoint {}: rank {rank}'s tier thread dies at step {step}",
                super::FP_MEMORY_TIER_DIE
            );
        }
        let (mut exchange, mut replica) = (Duration::ZERO, Duration::ZERO);
        for k in 1..=self.tier.replicas {
            let (to, from) = (
                self.tier.peer(rank, k, world),
                self.tier.source(rank, k, world),
            );
            let t = Instant::now();
            let got = match self.group.send_recv(Some(to), &sent, Some(from)) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    return broken(step, Error::Config("send_recv returned no buffer".into()));
                }
                Err(e) => return broken(step, e.into()),
            };
            exchange += t.elapsed();
            let t = Instant::now();
            let (_, engine) = &mut self.replicas[k - 1];
            let published = publish_frame(got, from, engine, from, world, &self.run);
            replica += t.elapsed();
            if let Err(e) = published {
                reason.get_or_insert_with(|| format!("replica of rank {from}: {e}"));
            }
        }
        drop(sent);
        let t_agree = Instant::now();
        match self.group.all_agree(reason.is_none()) {
            Ok(true) => Outcome::Whole {
                step,
                ms: t0.elapsed().as_secs_f64() * 1e3,
                phases: SavePhases {
                    own_ms: ms(t_own),
                    read_ms: ms(t_read - t_own),
                    exchange_ms: ms(exchange),
                    replica_ms: ms(replica),
                    agree_ms: ms(t_agree.elapsed()),
                },
                held: self.held(),
            },
            Ok(false) => Outcome::Partial {
                step,
                reason: reason.unwrap_or_else(|| "another rank's part or replica failed".into()),
            },
            Err(e) => broken(step, e.into()),
        }
    }

    /// Publishes this rank's own part of `job`'s step.
    fn publish_own<M: Module + 'static>(&mut self, job: ShardJob<M>) -> Result<u64> {
        let (rank, world) = (self.rank(), self.group.size());
        let step = job.trainer.step;
        let root = self.own_root.clone();
        #[cfg(feature = "failpoints")]
        if let Some(Some(at)) = fail::eval(super::FP_MEMORY_TIER_PART, |arg| arg)
            && at == format!("{rank}@{step}")
        {
            return Err(Error::Tier {
                path: root,
                reason: format!("failpoint {} at step {step}", super::FP_MEMORY_TIER_PART),
            });
        }
        #[cfg(feature = "failpoints")]
        if let Some(Some(at)) = fail::eval(super::FP_MEMORY_TIER_PANIC, |arg| arg)
            && at == format!("{rank}@{step}")
        {
            panic!("failpoint {} at step {step}", super::FP_MEMORY_TIER_PANIC);
        }
        let mut snap = part_snapshot(step, job.trainer.epoch, rank, world, &self.run);
        if let Some(model) = job.model {
            snap = model.add_to(snap, &root, step);
        }
        let optim = job.optim;
        snap = snap
            .with_producer(
                shard_file_name(rank, world),
                move |sink: &mut dyn std::io::Write| {
                    optim.write(&root, step, sink)?;
                    Ok(())
                },
            )
            .with_bytes(SCHEDULER_FILE, encode_scheduler(job.scheduler)?)
            .with_bytes(TRAINER_FILE, job.trainer.to_bytes());
        self.own.submit(snap)?;
        Ok(self.own.wait_idle()?.iter().map(|e| e.bytes).sum())
    }

    /// Bytes this rank's tier holds now (own parts and replicas).
    fn held(&self) -> u64 {
        root_bytes(&self.own_root)
            + self
                .replicas
                .iter()
                .map(|(_, e)| root_bytes(e.root()))
                .sum::<u64>()
    }

    fn close(self) {
        let root = self.own_root.clone();
        for e in std::iter::once(self.own).chain(self.replicas.into_iter().map(|(_, e)| e)) {
            if let Err(e) = e.finish() {
                tracing::warn!(tier = %root.display(), error = %e, "closing a memory-tier root failed");
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn broken(step: u64, e: Error) -> Outcome {
    Outcome::Broken {
        step,
        reason: e.to_string(),
    }
}

/// Removes this rank's tier directories of run `run` (own part, replicas) and the run's
/// directory once empty: after a run that finished cleanly.
pub(crate) fn remove_rank_dirs(tier: &MemoryTier, rank: usize, world: usize, run: &str) {
    let mut dirs = vec![tier.own_root(rank, world, run)];
    dirs.extend((1..=tier.replicas).map(|k| {
        let of = tier.source(rank, k, world);
        tier.replica_root(rank, of, world, run)
    }));
    for d in dirs {
        if let Err(e) = std::fs::remove_dir_all(&d)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(tier = %d.display(), error = %e, "cannot remove the memory tier");
        }
    }
    // Empty only once every rank of the node removed its own: the last one removes it.
    let _ = std::fs::remove_dir(tier.run_dir(rank, run));
}
