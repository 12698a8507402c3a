//! The snippets of `docs/learner.md`.

use burn::tensor::Device;
use burn::train::{Learner, LearnerModel, SupervisedTraining, TrainLoader, ValidLoader};
use burn_ckpt::{CkptCheckpointers, EngineConfig, Retention};

/// "The strategy".
#[rustfmt::skip] // verbatim from docs/learner.md
fn strategy<M: LearnerModel>(
    train: TrainLoader<M>,
    valid: ValidLoader<M>,
    device: Device,
    learner: Learner<M>,
) -> anyhow::Result<()> {
    use burn_ckpt::{CkptCheckpointers, CkptTrainingStrategy, EngineConfig, FrequencyPolicy, Retention};

    let ckpt = CkptCheckpointers::open(EngineConfig::new("runs/x/ckpt").retention(Retention::keep_last(3)))?;
    let strategy = CkptTrainingStrategy::new(device, &ckpt, FrequencyPolicy::EverySteps(100))
        .resume_latest()
        .deterministic(42);
    let result = SupervisedTraining::new("runs/x", train, valid)
        .num_epochs(10)
        .with_training_strategy(strategy.into_training_strategy())
        .launch(learner);
    let summary = ckpt.finish()?;                    // the last save durable, the root unlocked
    if let Some(err) = &result.error {
        eprintln!("training failed: {err}");
    }
    Ok(())
}

/// "Epoch checkpoints".
#[rustfmt::skip] // verbatim from docs/learner.md
fn epoch_route<M: LearnerModel>(
    train: TrainLoader<M>,
    valid: ValidLoader<M>,
    learner: Learner<M>,
) -> anyhow::Result<()> {
    use burn_ckpt::ckpt_burn::checkpointers::AlwaysSave;

    let ckpt = CkptCheckpointers::open(EngineConfig::new("runs/x/ckpt").retention(Retention::keep_last(3)))?;
    let (model_ckpt, optim_ckpt, sched_ckpt) = ckpt.checkpointers();
    let result = SupervisedTraining::new("runs/x", train, valid)
        .with_custom_checkpointers(model_ckpt, optim_ckpt, sched_ckpt)
        .with_checkpointing_strategy(AlwaysSave)
        .launch(learner);
    ckpt.finish()?;
    Ok(())
}
