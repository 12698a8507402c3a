//! The README's library snippets, verbatim, each inside a function that gives it the values it
//! uses, so `cargo test` (which builds every example) proves they compile;
//! `tests/docs.rs` checks every `rust` block of the README is here. Not meant to be run.

#![allow(dead_code, unused_variables)]

use std::sync::{Arc, atomic::AtomicBool};
use std::time::Duration;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::Device;
use burn::train::{Learner, LearnerModel, SupervisedTraining, TrainLoader, ValidLoader};
use burn_ckpt::ManagerConfig;

/// "Through Burn's learner".
#[rustfmt::skip] // verbatim from the README
fn learner_quickstart<M: LearnerModel>(
    train: TrainLoader<M>,
    valid: ValidLoader<M>,
    device: Device,
    learner: Learner<M>,
) -> anyhow::Result<()> {
    use burn_ckpt::{CkptCheckpointers, CkptTrainingStrategy, EngineConfig, FrequencyPolicy, Retention};

    let ckpt = CkptCheckpointers::open(EngineConfig::new("runs/x/ckpt").retention(Retention::keep_last(3)))?;
    let strategy = CkptTrainingStrategy::new(device, &ckpt, FrequencyPolicy::EverySteps(100)).resume_latest();
    let result = SupervisedTraining::new("runs/x", train, valid)
        .with_training_strategy(strategy.into_training_strategy())
        .launch(learner);
    ckpt.finish()?;                                  // waits for the last save, returns any error
    Ok(())
}

/// "From a loop of your own".
#[rustfmt::skip] // verbatim from the README
fn custom_loop_quickstart<M: Module + 'static>(
    mut model: M,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    steps: u64,
    train_one_step: impl Fn(&mut M, &mut ModuleOptimizer, &mut ModuleLrScheduler),
) -> anyhow::Result<()> {
    use burn_ckpt::{CheckpointManager, DataCursor, ManagerConfig};

    let mut ckpt = CheckpointManager::open(ManagerConfig::new("runs/x").every_steps(100).end_step(steps))?;
    let start = ckpt.resume(&mut model, &mut optim, &mut sched)?.map_or(0, |t| t.step);
    for step in start + 1..=steps {
        train_one_step(&mut model, &mut optim, &mut sched);
        if ckpt.step(step, &model, &optim, &sched, DataCursor::default())? { break; }
    }
    let report = ckpt.finish()?;                     // every save durable; what they cost
    Ok(())
}

/// "Preemption".
#[rustfmt::skip] // verbatim from the README
fn preemption() -> anyhow::Result<ManagerConfig> {
    let flag = Arc::new(AtomicBool::new(false));
    let _signals = burn_ckpt::StopOnSignal::install_flag(flag.clone())?;
    let config = ManagerConfig::new("runs/x").every_steps(100).stop_on(flag, Some(Duration::from_secs(60)));
    Ok(config)
}

fn main() {
    eprintln!("the README's snippets compile; nothing to run");
}
