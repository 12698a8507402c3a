//! The example trainer on N ranks with ZeRO-1: threads in this process ([`run_threads`]) or
//! MPI processes ([`run_mpi`], feature `mpi`). It trains the same model on the same data as
//! [`crate::trainer::run`] and checkpoints through [`ShardedSaver`] with the same
//! [`ckpt_core::CheckpointSession`] policies: at every step boundary the ranks agree over the
//! training group ([`agree_on_boundary`]) on rank 0's save decision and on any rank's stop
//! request, so all ranks save, and stop, at the same step.
//!
//! Burn's backend RNG is process-global, so with rank threads each rank seeds it and runs its
//! forward and backward pass under one process-wide lock: every rank draws exactly the dropout
//! masks a single rank would. With `replicate_data`, every rank reads the same batches, so N
//! ranks train exactly like one and write the same bytes.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::GradientsParams;
use burn::tensor::Bytes;
use ckpt_burn::{
    DataCursor, TrainerState, load_model, load_scheduler, load_trainer_state, mix_seed,
    save_memory, step_seed,
};
use ckpt_core::{Engine, SaveTarget, Submitted, engine::SubmitOutcome};
use ckpt_zero::collective::{Collective, ThreadGroup};
use ckpt_zero::shards::{filter_optimizer, read_full_optimizer};
use ckpt_zero::{ShardFormat, ShardJob, ShardedSaver, Zero1, agree_on_boundary, join_ranks};

use crate::model::{optimizer, scheduler};
use crate::tier::Tier;
use crate::trainer::{self as demo, DemoConfig, DemoReport, Frequency, StepInfo};
use crate::{Error, Result};

/// Settings of a multi-rank run.
#[derive(Debug, Clone)]
pub struct ZeroConfig {
    /// The single-rank settings (model, data, steps, checkpointing, resume).
    pub demo: DemoConfig,
    /// Number of ranks.
    pub ranks: usize,
    /// How optimizer shards are written.
    pub shard_format: ShardFormat,
    /// Every rank reads the same batches (N ranks then match 1 rank byte for byte); otherwise
    /// each rank shuffles with its own seed.
    pub replicate_data: bool,
    /// Deadline of every collective call.
    pub timeout: Duration,
}

impl ZeroConfig {
    /// `ranks` ranks over `demo`, consolidated shards, replicated data, 60 s timeout.
    pub fn new(demo: DemoConfig, ranks: usize) -> Self {
        Self {
            demo,
            ranks,
            shard_format: ShardFormat::Consolidated,
            replicate_data: true,
            timeout: Duration::from_secs(60),
        }
    }

    fn validate(&self) -> Result<()> {
        if self.ranks == 0 {
            return Err(Error::Config("--ranks must be at least 1".into()));
        }
        self.demo.validate()?;
        if self.demo.backpressure != ckpt_core::Backpressure::Block || self.demo.max_in_flight != 1
        {
            return Err(Error::Config(
                "ZeRO ranks keep one checkpoint in flight and wait for it before the next \
                 (--backpressure block --max-in-flight 1)"
                    .into(),
            ));
        }
        if self.demo.save_mode != crate::trainer::SaveMode::Async {
            return Err(Error::Config(
                "ZeRO ranks checkpoint with --save-mode async only".into(),
            ));
        }
        Ok(())
    }
}

/// What rank 0 opened: its engine (none when checkpointing is off), the checkpoint to resume,
/// and the URL it was downloaded from when the object store had a newer valid one.
type Opened = (Option<Engine>, Option<PathBuf>, Option<String>);

/// Opens rank 0's engine (recovery under the root lock) and finds the checkpoint to resume,
/// restoring it from the object store (`--upload-to`) when no valid local one is as new.
fn open_engine(cfg: &ZeroConfig) -> Result<Opened> {
    let d = &cfg.demo;
    if matches!(d.frequency, Frequency::EverySteps(0)) {
        let latest = if d.resume {
            ckpt_burn::latest_valid(&d.dir)?
        } else {
            None
        };
        return Ok((None, latest, None));
    }
    let (mut engine, mut latest) = demo::open_engine(d)?;
    let mut from_remote = None;
    if d.resume
        && let Some((dir, from)) = crate::tier::restore(d, &mut engine, latest.as_deref())?
    {
        latest = Some(dir);
        from_remote = Some(from);
    }
    Ok((Some(engine), latest, from_remote))
}

/// Runs `cfg.ranks` ranks as threads of this process; returns rank 0's report.
pub fn run_threads(cfg: &ZeroConfig, progress: &mut dyn FnMut(&StepInfo)) -> Result<DemoReport> {
    cfg.validate()?;
    let (engine, latest, from_remote) = open_engine(cfg)?;
    let mut groups = ThreadGroup::new(cfg.ranks, cfg.timeout).into_iter();
    let g0 = groups
        .next()
        .ok_or_else(|| Error::Config("no ranks".into()))?;
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for g in groups {
            let latest = latest.clone();
            let rank = g.rank();
            let h = std::thread::Builder::new()
                .name(format!("zero-rank-{rank}"))
                .spawn_scoped(s, move || {
                    run_rank(cfg, Box::new(g), None, (latest, None), &mut |_| {}).map(|_| ())
                })
                .map_err(|e| ckpt_zero::Error::Rank {
                    rank,
                    reason: e.to_string(),
                })?;
            handles.push((rank, h));
        }
        let r0 = run_rank(
            cfg,
            Box::new(g0),
            engine,
            (latest.clone(), from_remote),
            progress,
        );
        join_ranks(r0, handles)
    })
}

/// Runs this MPI process as one rank of `mpirun -n N` (`cfg.ranks` is ignored: the MPI world
/// size rules; `progress` is called on rank 0 only). `conclude` gets the rank and its report
/// (only rank 0's covers the whole checkpoint) and runs on every rank before the ranks meet a
/// last time and finalize MPI, so whatever rank 0 prints there is out before any rank exits:
/// `mpirun` ends the job as soon as one rank exits non-zero (75 after a stop, say).
#[cfg(feature = "mpi")]
pub fn run_mpi<T>(
    cfg: &ZeroConfig,
    progress: &mut dyn FnMut(&StepInfo),
    conclude: impl FnOnce(usize, DemoReport) -> T,
) -> Result<T> {
    let mut world = ckpt_zero::collective::mpi::MpiGroup::world(cfg.timeout)?;
    let mut last = ckpt_zero::collective::mpi::MpiGroup::world(cfg.timeout)?;
    let mut cfg = cfg.clone();
    cfg.ranks = world.size();
    cfg.validate()?;
    let rank = world.rank();
    let (engine, latest, from_remote) = if rank == 0 {
        open_engine(&cfg)?
    } else {
        (None, None, None)
    };
    // Everyone resumes from the checkpoint rank 0 recovered.
    let mut path = latest
        .map(|p| p.to_string_lossy().into_owned().into_bytes())
        .unwrap_or_default();
    world.broadcast(0, &mut path)?;
    let latest =
        (!path.is_empty()).then(|| PathBuf::from(String::from_utf8_lossy(&path).into_owned()));
    // On error the process exits without finalizing and mpirun ends the job: the other ranks
    // fail within their timeout either way.
    let mut quiet = |_: &StepInfo| {};
    let progress: &mut dyn FnMut(&StepInfo) = if rank == 0 { progress } else { &mut quiet };
    let report = run_rank(
        &cfg,
        Box::new(world),
        engine,
        (latest, from_remote),
        progress,
    )?;
    let out = conclude(rank, report);
    last.barrier()?;
    drop(last);
    // Every group is dropped by now (the checkpoint thread is joined): finalize on this, the
    // initializing thread, or Open MPI's mpirun reports an abnormal termination.
    ckpt_zero::collective::mpi::finalize()?;
    Ok(out)
}

/// Bytes of `params` (f32).
fn param_bytes<'a>(params: impl Iterator<Item = &'a ckpt_zero::ParamInfo>) -> u64 {
    params.map(|p| p.numel() as u64 * 4).sum()
}

/// One rank's training loop. `resume` is the checkpoint to resume (the same on every rank)
/// and, on rank 0, the URL it was downloaded from.
fn run_rank(
    cfg: &ZeroConfig,
    mut group: Box<dyn Collective>,
    engine: Option<Engine>,
    resume: (Option<PathBuf>, Option<String>),
    progress: &mut dyn FnMut(&StepInfo),
) -> Result<DemoReport> {
    let (latest, from_remote) = resume;
    let wall = Instant::now();
    let d = &cfg.demo;
    let rank = group.rank();
    let world = group.size();
    // The checkpoint group, then the upload group (`--upload-to`): created first, in the same
    // order on every rank.
    let ckpt_group = group.split()?;
    let (tier, after_publish) = Tier::sharded(d, || Ok(group.split()?))?;
    let uploads = tier.done.clone();
    let device = d.backend.device().autodiff();

    let mut model = {
        let _g = ckpt_burn::backend_rng_lock();
        demo::fresh_model(d, &device)
    };
    let mut optim = optimizer();
    let mut sched = scheduler(d.lr)?;
    let shuffle_seed = if cfg.replicate_data {
        d.seed
    } else {
        mix_seed(&[d.seed, rank as u64, 0x2a4b])
    };
    let loader = demo::data_loader(d, shuffle_seed, &device)?;

    let mut report = DemoReport {
        save_mode: Some(d.save_mode),
        ..Default::default()
    };
    let mut start = 0;
    let partition = ckpt_zero::Partition::of(&model, world);
    match (d.resume, &latest) {
        (true, Some(dir)) => {
            model = load_model(dir, model)?;
            let full = read_full_optimizer(dir)?;
            let mine = filter_optimizer(&dir.display().to_string(), full, |id| {
                partition.owns(rank, id)
            })?;
            optim = optim.from_bytes(Bytes::from_bytes_vec(mine)).map_err(|e| {
                ckpt_zero::Error::Shard {
                    file: dir.join(ckpt_burn::OPTIM_FILE),
                    reason: e.to_string(),
                }
            })?;
            sched = load_scheduler(dir, sched)?;
            let t = load_trainer_state(dir)?;
            if t.base_seed != d.seed {
                return Err(Error::Config(format!(
                    "{} was written with --seed {}, not {}",
                    dir.display(),
                    t.base_seed,
                    d.seed
                )));
            }
            loader.set_cursor(DataCursor {
                shuffle_seed,
                ..t.cursor
            })?;
            start = t.step;
            report.resumed_from = Some(dir.clone());
            report.resumed_from_remote = from_remote;
        }
        _ => {
            if let Some(init) = &d.init_from {
                model = load_model(init, model)?;
            }
        }
    }
    report.start_step = start;

    // What a save holds in memory on this rank: the model (rank 0 writes it) and the AdamW
    // moments of the parameters this rank owns.
    let model_bytes = if rank == 0 {
        param_bytes(partition.params().iter())
    } else {
        0
    };
    let need = save_memory(model_bytes, Some(2 * param_bytes(partition.owned_by(rank))));
    let mut session = d.session();
    session.resumed_at(start);
    let mut zero = Zero1::new(&model, group);
    let mut saver = if session.enabled() {
        Some(RankTarget {
            saver: ShardedSaver::start_with(
                ckpt_group,
                cfg.shard_format,
                d.dir.clone(),
                engine,
                after_publish,
            )?,
            tier,
        })
    } else {
        None
    };
    let mse = MseLoss::new();
    let mut final_step = d.steps.max(start);

    for step in start + 1..=d.steps {
        let t_step = Instant::now();
        let (epoch, loss_value, grads) = {
            let _g = ckpt_burn::backend_rng_lock();
            device.seed(step_seed(d.seed, step));
            let (epoch, batch) = loader.next_batch()?;
            let out = model.forward(batch.x);
            let loss = mse.forward(out, batch.y, Reduction::Mean);
            let loss_value = loss.clone().try_into_scalar::<f32>().ok();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            (epoch, loss_value, grads)
        };
        let lr = sched.step();
        model = zero.step(&mut optim, lr, model, grads)?;
        let step_time = t_step.elapsed();
        report.step_ms.push(demo::ms(step_time));
        report.final_loss = loss_value;

        let in_flight = saver.as_ref().map_or(0, |s| s.in_flight());
        // Every rank takes part, checkpointing or not: a stop requested on any rank stops all.
        let b = session.boundary(step, step_time, in_flight, |p| {
            agree_on_boundary(zero.group(), p)
        })?;
        if let Some(saver) = saver.as_mut() {
            if b.save {
                let cursor = loader.cursor();
                let job = || ShardJob {
                    model: (rank == 0).then(|| model.clone().into()),
                    optim: optim.clone().into(),
                    scheduler: sched.to_record(),
                    trainer: TrainerState::new(
                        step,
                        DataCursor {
                            shuffle_seed: d.seed,
                            ..cursor
                        },
                        d.seed,
                    ),
                };
                session.save(saver, step, |s, gate| {
                    let route = gate.route(need, step);
                    let t0 = Instant::now();
                    s.saver.submit(job())?;
                    Ok::<_, Error>(Submitted {
                        outcome: SubmitOutcome::Queued {
                            step,
                            blocked: t0.elapsed(),
                        },
                        route,
                    })
                })?;
            }
            session.poll(saver)?;
        }
        progress(&StepInfo {
            step,
            steps: d.steps,
            epoch,
            loss: loss_value.unwrap_or(f32::NAN),
            published: session.published(),
            in_flight: saver.as_ref().map_or(0, |s| s.in_flight()),
        });
        if d.abort_at_step == Some(step) {
            std::process::abort();
        }
        if b.stop {
            final_step = step;
            break;
        }
    }
    let sessioned = match saver {
        Some(s) => session.finish(s, RankTarget::close)?,
        None => session.finish(NoSaver, |_| Ok(Vec::new()))?,
    };
    report.absorb(sessioned);
    report.uploads = uploads.lock().map(|u| u.clone()).unwrap_or_default();
    report.final_step = final_step;
    report.wall_s = wall.elapsed().as_secs_f64();
    Ok(report)
}

/// A rank's checkpoint target: its sharded saver, and the object-store tier behind it
/// (inactive without `--upload-to`), whose failures come back like the saver's.
struct RankTarget {
    saver: ShardedSaver<crate::Mlp>,
    tier: Tier,
}

impl SaveTarget for RankTarget {
    type Error = Error;
    fn in_flight(&self) -> usize {
        self.saver.in_flight()
    }
    fn poll(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        let events = SaveTarget::poll(&mut self.saver)?;
        self.tier.published(&events)?;
        Ok(events)
    }
    fn wait_idle(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        let events = SaveTarget::wait_idle(&mut self.saver)?;
        self.tier.published(&events)?;
        Ok(events)
    }
    fn blocked_total(&self) -> Duration {
        self.saver.blocked_total()
    }
    // Shards are written by every rank; their held memory is not counted.
    fn held_bytes(&self) -> Option<u64> {
        None
    }
    fn wait_held_at_most(&mut self, _limit: u64) -> Result<bool> {
        Ok(false)
    }
}

impl RankTarget {
    /// Closes the saver (every save published), then waits for every upload.
    fn close(self) -> Result<Vec<ckpt_core::SaveEvent>> {
        let RankTarget { saver, mut tier } = self;
        let events = saver.close()?;
        tier.published(&events)?;
        tier.finish()?;
        Ok(events)
    }
}

/// The target of a run without checkpoints.
struct NoSaver;

impl SaveTarget for NoSaver {
    type Error = ckpt_zero::Error;
    fn in_flight(&self) -> usize {
        0
    }
    fn poll(&mut self) -> ckpt_zero::Result<Vec<ckpt_core::SaveEvent>> {
        Ok(Vec::new())
    }
    fn wait_idle(&mut self) -> ckpt_zero::Result<Vec<ckpt_core::SaveEvent>> {
        Ok(Vec::new())
    }
    fn held_bytes(&self) -> Option<u64> {
        None
    }
    fn wait_held_at_most(&mut self, _limit: u64) -> ckpt_zero::Result<bool> {
        Ok(false)
    }
}
