//! The README's library snippets, verbatim, each inside a function that gives it the values it
//! uses, so `cargo test` (which builds every example) proves they compile;
//! `tests/readme.rs` checks every `rust` block of the README is here. Not meant to be run.

#![allow(dead_code, unused_variables, clippy::too_many_arguments)]

use std::path::PathBuf;
use std::sync::{Arc, atomic::AtomicBool};
use std::time::Duration;

use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Device;
use burn::train::{Learner, LearnerModel, SupervisedTraining, TrainLoader, ValidLoader};
use burn_ckpt::{ckpt_burn, ckpt_core, ckpt_zero};
use ckpt_burn::{FrozenState, TrainerState};
use ckpt_core::{CheckpointSession, Engine, EngineConfig, FrequencyPolicy, SessionConfig};
use ckpt_zero::collective::Collective;
use ckpt_zero::{ShardFormat, ShardJob};

/// "Adding checkpointing to an existing Burn program".
#[rustfmt::skip] // verbatim from the README
fn learner_hook<M: LearnerModel>(
    train: TrainLoader<M>,
    valid: ValidLoader<M>,
    device: Device,
    learner: Learner<M>,
) -> anyhow::Result<()> {
    use burn_ckpt::{CkptCheckpointers, CkptTrainingStrategy, EngineConfig, FrequencyPolicy, Retention};

    let config = EngineConfig::new("runs/x/ckpt").retention(Retention::keep_last(3));
    let ckpt = CkptCheckpointers::open(config)?;
    let result = SupervisedTraining::new("runs/x", train, valid)
        .with_training_strategy(                     // every 100 steps and at each epoch's end
            CkptTrainingStrategy::new(device, &ckpt, FrequencyPolicy::EverySteps(100))
                .resume_latest()                     // continue from the newest valid checkpoint
                .deterministic(42)                   // dropout replays on resume
                .into_training_strategy())
        .num_epochs(10)
        .launch(learner);
    ckpt.finish()?;                                  // waits for the last save, returns any error
    Ok(())
}

/// "A training loop of your own".
#[rustfmt::skip] // verbatim from the README
fn manager_loop<M: Module + 'static>(
    mut model: M,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    steps: u64,
    train_one_step: impl Fn(&mut M, &mut ModuleOptimizer, &mut ModuleLrScheduler),
) -> anyhow::Result<()> {
    use burn_ckpt::{CheckpointManager, DataCursor, ManagerConfig};

    let mut ckpt = CheckpointManager::open(ManagerConfig::new("runs/x").every_steps(100))?;
    let start = ckpt.resume(&mut model, &mut optim, &mut sched)?.map_or(0, |t| t.step);
    for step in start + 1..=steps {
        train_one_step(&mut model, &mut optim, &mut sched);
        if ckpt.step(step, &model, &optim, &sched, DataCursor::default())? { break; }
    }
    let report = ckpt.finish()?;                     // every save durable; what they cost
    Ok(())
}

/// "Using the engine directly".
#[rustfmt::skip] // verbatim from the README
fn engine_directly(step: u64, bytes: Vec<u8>) -> anyhow::Result<()> {
    use ckpt_core::{Engine, EngineConfig, Retention, Snapshot};

    let (mut engine, recovery) = Engine::open(
        EngineConfig::new("runs/demo").retention(Retention::keep_last(3)),
    )?;
    if let Some(c) = recovery.latest { println!("resuming from step {}", c.step); }
    // At a step boundary: the snapshot owns its data, so training may continue at once.
    engine.submit(Snapshot::new(step).with_bytes("model.bin", bytes))?;
    // Every step: cheap, non-blocking; background failures come back here, typed, naming the step.
    for ev in engine.poll()? { println!("step {} durable in {:?}", ev.step, ev.to_durable); }
    engine.finish()?;
    Ok(())
}

/// "Using the engine directly": a training loop of your own with a `CheckpointSession`.
#[rustfmt::skip] // verbatim from the README
fn session_loop<M: Module + 'static>(
    mut model: M,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    mut engine: Engine,
    steps: u64,
    stop_flag: Arc<AtomicBool>,
    train_one_step: impl Fn(&mut M, &mut ModuleOptimizer, &mut ModuleLrScheduler) -> Duration,
    trainer_state: impl Fn(u64) -> TrainerState,
) -> anyhow::Result<()> {
    let mut session = CheckpointSession::new(
        SessionConfig::new(FrequencyPolicy::EverySteps(100)).end_step(steps)
            .memory_budget(Some(1 << 30)).stop_on(stop_flag, Some(Duration::from_secs(30))),
    );
    for step in 1..=steps {
        let took = train_one_step(&mut model, &mut optim, &mut sched);
        let b = session.boundary(step, took, engine.in_flight(), Ok::<_, ckpt_burn::Error>)?;
        if b.save {
            session.save(&mut engine, step, |e, gate| {
                let frozen = FrozenState::capture(&model, &optim, &sched, trainer_state(step));
                frozen.submit(e, gate, |snapshot| snapshot)   // on the route the budget allows
            })?;
        }
        session.poll(&mut engine)?;
        if b.stop { break; }
    }
    let report = session.finish(engine, |e| Ok(e.finish()?.events))?;
    Ok(())
}

/// "ZeRO-1 on several ranks": inside Burn's learner.
#[rustfmt::skip] // verbatim from the README
fn zero_strategy<M: LearnerModel>(
    training: SupervisedTraining<M>,
    learner: Learner<M>,
    device: Device,
) -> anyhow::Result<()> {
    let zero = ckpt_zero::strategy::ZeroTrainingStrategy::new(device, 4, EngineConfig::new("runs/z"), FrequencyPolicy::budget(0.02))?
        .shard_format(ShardFormat::PerRank)
        .deterministic(42)                               // dropout replays on resume; records seed 42
        .resume_latest();                                // from the newest valid checkpoint, any rank count
    let result = training.with_training_strategy(zero.into_training_strategy()).launch(learner);
    Ok(())
}

/// "ZeRO-1 on several ranks": from your own loop.
#[rustfmt::skip] // verbatim from the README
fn zero_own_loop<M: Module + 'static>(
    mut model: M,
    mut optim: ModuleOptimizer,
    sched: ModuleLrScheduler,
    train_group: ckpt_zero::collective::ThreadGroup,
    ckpt_group: Box<dyn Collective>,
    root: PathBuf,
    engine: Option<Engine>,
    lr: f64,
    grads: GradientsParams,
    rank: usize,
    trainer: TrainerState,
) -> anyhow::Result<()> {
    let mut zero = ckpt_zero::Zero1::new(&model, Box::new(train_group));        // per rank
    let mut saver = ckpt_zero::ShardedSaver::start(ckpt_group, ShardFormat::Consolidated,
                                                   root, engine /* rank 0 only */)?;
    model = zero.step(&mut optim, lr, model, grads)?;                          // every step
    saver.submit(ShardJob { model: (rank == 0).then(|| model.clone()),
                            optim: optim.clone().into(), scheduler: sched.to_record(), trainer })?;
    Ok(())
}

fn main() {
    eprintln!("the README's snippets compile; nothing to run");
}
