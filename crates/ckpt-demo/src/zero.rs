//! The example trainer on N ranks with ZeRO-1: threads in this process ([`run_threads`]) or
//! MPI processes ([`run_mpi`], feature `mpi`). It trains the same model on the same data as
//! [`crate::trainer::run`] and checkpoints through the library's [`RankManager`] with the
//! same policies: at every step boundary the ranks agree over the training group on rank 0's
//! save decision and on any rank's stop request, so all ranks save, and stop, at the same
//! step. This module keeps the model, the data and the loop; the checkpointing is the
//! library's.
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
use ckpt_burn::{DataCursor, TrainerState, load_model, mix_seed, save_memory, step_seed};
use ckpt_core::Engine;
use ckpt_zero::collective::{Collective, ThreadGroup};
use ckpt_zero::{
    MemoryTier, RankConfig, RankManager, RestoreSource, ShardFormat, ShardJob, ShardSave,
    ShardedRoot, Zero1, join_ranks,
};

use crate::model::{optimizer, scheduler};
use crate::tier;
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
    /// Also keep the newest steps in a node-local memory tier replicated to peer ranks.
    pub memory_tier: Option<MemoryTier>,
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
            memory_tier: None,
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

/// Opens rank 0's root (recovery under the root lock; a run that neither resumes nor starts
/// over is refused in a used root) and finds the checkpoint to resume, restoring it from the
/// object store (`--upload-to`) when no valid local one is as new.
fn open_root(cfg: &ZeroConfig) -> Result<Opened> {
    let d = &cfg.demo;
    if matches!(d.frequency, Frequency::EverySteps(0)) {
        let latest = if d.resume {
            ckpt_burn::latest_valid(&d.dir)?
        } else {
            None
        };
        return Ok((None, latest, None));
    }
    let mut root = ShardedRoot::open(demo::engine_config(d))?;
    // With a memory tier, recovery asks it first and downloads only when the object store
    // holds the newest step (`RankManager::resume_from`).
    if d.resume
        && cfg.memory_tier.is_none()
        && let Some(remote) = tier::remote(d)?
    {
        tier::restore_newer(&mut root, &remote)?;
    }
    let latest = root.settle(d.resume, d.fresh).map_err(|e| match e {
        ckpt_zero::Error::UsedRoot { newest, .. } => {
            let name = newest.file_name().map(|n| n.to_string_lossy().into_owned());
            demo::used_root(d, &name.unwrap_or_default())
        }
        e => e.into(),
    })?;
    let from = root.restored_from().map(str::to_owned);
    Ok((Some(root.into_engine()), latest, from))
}

/// Runs `cfg.ranks` ranks as threads of this process; returns rank 0's report.
pub fn run_threads(cfg: &ZeroConfig, progress: &mut dyn FnMut(&StepInfo)) -> Result<DemoReport> {
    cfg.validate()?;
    let (engine, latest, from_remote) = open_root(cfg)?;
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
        open_root(&cfg)?
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

    // What a save holds in memory on this rank: the model (rank 0 writes it) and the AdamW
    // moments of the parameters this rank owns.
    let model_bytes = if rank == 0 {
        param_bytes(partition.params().iter())
    } else {
        0
    };
    let need = save_memory(model_bytes, Some(2 * param_bytes(partition.owned_by(rank))));
    // The checkpoint group, then the upload group (`--upload-to`), then the memory tier's:
    // split off the training group first, in the same order on every rank.
    let mut config = RankConfig::new(&d.dir, d.session_config())
        .shard_format(cfg.shard_format)
        .save_memory(need);
    if let Some(remote) = tier::remote(d)? {
        config = tier::upload_shards(config, remote);
    }
    if let Some(t) = &cfg.memory_tier {
        config = config.memory_tier(t.clone());
    }
    let mut ckpt = RankManager::start(config, engine, group.as_mut())?;
    let restore = if d.resume {
        ckpt.resume_from(latest)?
    } else {
        None
    };
    match restore {
        Some(mut from) => {
            model = from.load_model(model)?;
            let mine = from.optimizer_shard(&partition, rank)?;
            optim = optim.from_bytes(Bytes::from_bytes_vec(mine)).map_err(|e| {
                ckpt_zero::Error::Shard {
                    file: from.dir().to_path_buf(),
                    reason: e.to_string(),
                }
            })?;
            sched = from.load_scheduler(sched)?;
            let t = from.trainer_state()?;
            if t.base_seed != d.seed {
                return Err(Error::Config(format!(
                    "{} was written with --seed {}, not {}",
                    from.dir().display(),
                    t.base_seed,
                    d.seed
                )));
            }
            loader.set_cursor(DataCursor {
                shuffle_seed,
                ..t.cursor
            })?;
            start = t.step;
            report.resumed_from = Some(from.dir().to_path_buf());
            report.resumed_from_remote = from_remote;
            report.resumed_from_memory = match from.source() {
                RestoreSource::Disk => None,
                RestoreSource::ObjectStore { url } => {
                    report.resumed_from_remote = Some(url.clone());
                    None
                }
                RestoreSource::OwnMemory => Some("its own part".into()),
                RestoreSource::PeerReplica { from } => Some(format!("the replica on rank {from}")),
            };
        }
        None => {
            if let Some(init) = &d.init_from {
                model = load_model(init, model)?;
            }
        }
    }
    report.start_step = start;

    ckpt.resumed_at(start);
    let mut zero = Zero1::new(&model, group);
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

        // Every rank takes part, checkpointing or not: a stop requested on any rank stops all.
        let b = ckpt.step(step, step_time, false, zero.group(), || {
            let cursor = loader.cursor();
            ShardSave::Now(ShardJob {
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
            })
        })?;
        progress(&StepInfo {
            step,
            steps: d.steps,
            epoch,
            loss: loss_value.unwrap_or(f32::NAN),
            published: ckpt.published(),
            in_flight: ckpt.in_flight(),
        });
        if d.abort_at_step == Some(step) {
            std::process::abort();
        }
        if b.stop {
            final_step = step;
            break;
        }
    }
    let done = ckpt.finish()?;
    report.absorb(done.session);
    report.uploads = done.uploads;
    report.memory_tier = done.memory;
    report.final_step = final_step;
    report.wall_s = wall.elapsed().as_secs_f64();
    Ok(report)
}
