//! The snippets of `docs/preemption.md`.

use std::sync::{Arc, atomic::AtomicBool};
use std::time::Duration;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::train::{Learner, LearnerModel, SupervisedTraining, TrainLoader, ValidLoader};
use burn_ckpt::{CkptCheckpointers, CkptTrainingStrategy};

/// "A loop of your own".
#[rustfmt::skip] // verbatim from docs/preemption.md
fn a_loop_of_your_own<M: Module + 'static>(
    mut model: M,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    steps: u64,
    train_one_step: impl Fn(&mut M, &mut ModuleOptimizer, &mut ModuleLrScheduler),
) -> anyhow::Result<()> {
    use burn_ckpt::ckpt_core::session::StopOutcome;
    use burn_ckpt::{CheckpointManager, DataCursor, ManagerConfig, StopOnSignal};

    let flag = Arc::new(AtomicBool::new(false));
    let _signals = StopOnSignal::install_flag(flag.clone())?;     // keep it alive until exit
    let config = ManagerConfig::new("runs/x").every_steps(100).end_step(steps)
        .stop_on(flag, Some(Duration::from_secs(60)));
    let mut ckpt = CheckpointManager::open(config)?;
    let start = ckpt.resume(&mut model, &mut optim, &mut sched)?.map_or(0, |t| t.step);
    for step in start + 1..=steps {
        train_one_step(&mut model, &mut optim, &mut sched);
        if ckpt.step(step, &model, &optim, &sched, DataCursor::default())? { break; }
    }
    let report = ckpt.finish()?;                                  // waits at most 60 s after a stop
    if let Some(stop) = &report.session.stopped {
        if stop.outcome == StopOutcome::GraceExpired {
            eprintln!("step {} was not durable in time; older checkpoints are intact", stop.step);
        }
        std::process::exit(75);                                   // "stopped, resume me"
    }
    Ok(())
}

/// "Burn's learner".
#[rustfmt::skip] // verbatim from docs/preemption.md
fn burns_learner<M: LearnerModel>(
    train: TrainLoader<M>,
    valid: ValidLoader<M>,
    learner: Learner<M>,
    ckpt: CkptCheckpointers,
    strategy: CkptTrainingStrategy,
) -> anyhow::Result<()> {
    use burn_ckpt::StopOnSignal;

    let training = SupervisedTraining::new("runs/x", train, valid)
        .with_training_strategy(strategy.into_training_strategy());
    let signals = StopOnSignal::install(training.interrupter())?;
    let result = training.launch(learner);
    ckpt.finish_within(Duration::from_secs(60))?;                 // Err(GraceExpired) after 60 s
    if let Some(sig) = signals.received() {
        eprintln!("stopped by signal {sig}; the final checkpoint is durable");
        std::process::exit(75);
    }
    Ok(())
}
