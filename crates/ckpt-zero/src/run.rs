//! The example trainer on N ranks with ZeRO-1: threads in this process ([`run_threads`]) or
//! MPI processes ([`run_mpi`], feature `mpi`). It trains the same model on the same data as
//! `ckpt_burn::demo::run` and checkpoints through [`ShardedSaver`] at the same steps; under an
//! overhead budget, at the steps rank 0's [`FrequencyController`] picks, broadcast to every
//! rank over the training group each step.
//!
//! Burn's backend RNG is process-global, so with rank threads each rank seeds it and runs its
//! forward and backward pass under one process-wide lock: every rank draws exactly the dropout
//! masks a single rank would. With `replicate_data`, every rank reads the same batches, so N
//! ranks train exactly like one and write the same bytes.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::GradientsParams;
use burn::tensor::Bytes;
use ckpt_burn::demo::{
    self, DemoConfig, DemoReport, Frequency, SaveRecord, StepInfo, optimizer, scheduler,
};
use ckpt_burn::{
    DataCursor, TrainerState, load_model, load_scheduler, load_trainer_state, mix_seed, step_seed,
};
use ckpt_core::{Engine, FrequencyController, FrequencyPolicy};

use crate::collective::{Collective, ThreadGroup};
use crate::shards::{filter_optimizer, read_full_optimizer};
use crate::{Error, Result, ShardFormat, ShardJob, ShardedSaver, Zero1};

/// Serializes seeding + forward/backward across rank threads (the backend RNG is global).
static RNG_LOCK: Mutex<()> = Mutex::new(());

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
        if self.demo.steps == 0 {
            return Err(Error::Config("--steps must be at least 1".into()));
        }
        if let Frequency::OverheadBudget(f) = self.demo.frequency
            && !(f > 0.0 && f < 1.0)
        {
            return Err(Error::Config(
                "the overhead budget must be a fraction in (0, 1)".into(),
            ));
        }
        if self.demo.save_mode != ckpt_burn::demo::SaveMode::Async {
            return Err(Error::Config(
                "ZeRO ranks checkpoint with --save-mode async only".into(),
            ));
        }
        Ok(())
    }
}

/// Opens rank 0's engine (recovery under the root lock) and finds the checkpoint to resume;
/// no engine when checkpointing is off.
fn open_engine(cfg: &ZeroConfig) -> Result<(Option<Engine>, Option<PathBuf>)> {
    let d = &cfg.demo;
    if matches!(d.frequency, Frequency::EverySteps(0)) {
        let latest = if d.resume {
            ckpt_burn::latest_valid(&d.dir)?
        } else {
            None
        };
        return Ok((None, latest));
    }
    let (engine, latest) = demo::open_engine(d)?;
    Ok((Some(engine), latest))
}

/// Whether every rank checkpoints after `step`. A fixed interval needs no talk; under an
/// overhead budget rank 0's controller decides and broadcasts the decision over `group`, so
/// all ranks save at the same steps (every rank must call this at every step boundary).
pub(crate) fn agree_to_save(
    ctrl: &mut FrequencyController,
    group: &mut dyn Collective,
    step: u64,
    now: Duration,
    persisting: bool,
) -> Result<bool> {
    if !matches!(ctrl.policy(), FrequencyPolicy::OverheadBudget { .. }) {
        return Ok(ctrl.should_save(step, now, persisting));
    }
    let mine = group.rank() == 0 && ctrl.should_save(step, now, persisting);
    let mut decision = vec![u8::from(mine)];
    group.broadcast(0, &mut decision)?;
    Ok(decision.first() == Some(&1))
}

/// Joins the other rank threads after rank 0 finished with `r0`: rank 0's own error first,
/// else the first other rank's (a panic included), else rank 0's result.
pub(crate) fn join_ranks<T>(
    r0: Result<T>,
    handles: Vec<(usize, std::thread::ScopedJoinHandle<'_, Result<()>>)>,
) -> Result<T> {
    let mut first_err = None;
    for (rank, h) in handles {
        let reason = match h.join() {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "panicked".into(),
        };
        first_err.get_or_insert(Error::Rank { rank, reason });
    }
    match (r0, first_err) {
        (Ok(v), None) => Ok(v),
        (Err(e), _) | (Ok(_), Some(e)) => Err(e),
    }
}

/// Runs `cfg.ranks` ranks as threads of this process; returns rank 0's report.
pub fn run_threads(cfg: &ZeroConfig, progress: &mut dyn FnMut(&StepInfo)) -> Result<DemoReport> {
    cfg.validate()?;
    let (engine, latest) = open_engine(cfg)?;
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
                    run_rank(cfg, Box::new(g), None, latest, &mut |_| {}).map(|_| ())
                })
                .map_err(|e| Error::Rank {
                    rank,
                    reason: e.to_string(),
                })?;
            handles.push((rank, h));
        }
        let r0 = run_rank(cfg, Box::new(g0), engine, latest.clone(), progress);
        join_ranks(r0, handles)
    })
}

/// Runs this MPI process as one rank of `mpirun -n N`; rank 0 returns its report, the other
/// ranks `None`. `cfg.ranks` is ignored (the MPI world size rules).
#[cfg(feature = "mpi")]
pub fn run_mpi(
    cfg: &ZeroConfig,
    progress: &mut dyn FnMut(&StepInfo),
) -> Result<Option<DemoReport>> {
    let mut world = crate::collective::mpi::MpiGroup::world(cfg.timeout)?;
    let mut cfg = cfg.clone();
    cfg.ranks = world.size();
    cfg.validate()?;
    let rank = world.rank();
    let (engine, latest) = if rank == 0 {
        open_engine(&cfg)?
    } else {
        (None, None)
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
    let report = run_rank(&cfg, Box::new(world), engine, latest, progress)?;
    // Every group is dropped by now (the checkpoint thread is joined): finalize on this, the
    // initializing thread, or Open MPI's mpirun reports an abnormal termination.
    crate::collective::mpi::finalize()?;
    Ok((rank == 0).then_some(report))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One rank's training loop.
fn run_rank(
    cfg: &ZeroConfig,
    mut group: Box<dyn Collective>,
    engine: Option<Engine>,
    latest: Option<PathBuf>,
    progress: &mut dyn FnMut(&StepInfo),
) -> Result<DemoReport> {
    let wall = Instant::now();
    let d = &cfg.demo;
    let rank = group.rank();
    let world = group.size();
    // The checkpoint group: created first, in the same order on every rank.
    let ckpt_group = group.split()?;
    let device = d.backend.device().autodiff();

    let mut model = {
        let _g = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
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
    let partition = crate::Partition::of(&model, world);
    match (d.resume, &latest) {
        (true, Some(dir)) => {
            model = load_model(dir, model)?;
            let full = read_full_optimizer(dir)?;
            let mine = filter_optimizer(&dir.display().to_string(), full, |id| {
                partition.owns(rank, id)
            })?;
            optim = optim
                .from_bytes(Bytes::from_bytes_vec(mine))
                .map_err(|e| Error::Shard {
                    file: dir.join(ckpt_burn::OPTIM_FILE),
                    reason: e.to_string(),
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
        }
        _ => {
            if let Some(init) = &d.init_from {
                model = load_model(init, model)?;
            }
        }
    }
    report.start_step = start;

    let policy = match d.frequency {
        Frequency::EverySteps(0) => FrequencyPolicy::Never,
        Frequency::EverySteps(n) => FrequencyPolicy::EverySteps(n),
        Frequency::OverheadBudget(f) => FrequencyPolicy::budget(f),
    };
    // Under a budget rank 0's controller decides and broadcasts each step's decision over the
    // training group, so every rank saves at the same steps; a fixed interval needs no talk.
    let mut ctrl = FrequencyController::new(policy);
    let mut zero = Zero1::new(&model, group);
    let mut saver = if policy != FrequencyPolicy::Never {
        Some(ShardedSaver::start(
            ckpt_group,
            cfg.shard_format,
            d.dir.clone(),
            engine,
        )?)
    } else {
        None
    };
    let mut stalls: BTreeMap<u64, Duration> = BTreeMap::new();
    let mut outcomes = Vec::new();
    let mse = MseLoss::new();

    for step in start + 1..=d.steps {
        let t_step = Instant::now();
        let (epoch, loss_value, grads) = {
            let _g = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
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
        report.step_ms.push(ms(step_time));
        report.final_loss = loss_value;

        if let Some(saver) = saver.as_mut() {
            let persisting = saver.in_flight() > 0;
            ctrl.observe_step(step_time, persisting);
            let due = agree_to_save(&mut ctrl, zero.group(), step, wall.elapsed(), persisting)?;
            if due || step == d.steps {
                let t0 = Instant::now();
                let cursor = loader.cursor();
                saver.submit(ShardJob {
                    model: (rank == 0).then(|| model.clone()),
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
                })?;
                stalls.insert(step, t0.elapsed());
                ctrl.saved(step, wall.elapsed());
            }
            for o in saver.poll()? {
                let stall = stalls.get(&o.step).copied().unwrap_or_default();
                ctrl.observe_save(stall, o.persist);
                outcomes.push(o);
            }
        }
        progress(&StepInfo {
            step,
            steps: d.steps,
            epoch,
            loss: loss_value.unwrap_or(f32::NAN),
            published: outcomes.len(),
            in_flight: saver.as_ref().map(|s| s.in_flight()).unwrap_or(0),
        });
        if d.abort_at_step == Some(step) {
            std::process::abort();
        }
    }
    if let Some(saver) = saver {
        outcomes.extend(saver.finish()?);
    }
    for o in &outcomes {
        report.saves.push(SaveRecord {
            step: o.step,
            stall_ms: ms(stalls.get(&o.step).copied().unwrap_or_default()),
            persist_ms: Some(ms(o.persist)),
            bytes: o.bytes,
            blocked_ms: 0.0,
        });
    }
    report.interval = ctrl.interval();
    report.final_step = d.steps.max(start);
    report.wall_s = wall.elapsed().as_secs_f64();
    Ok(report)
}
