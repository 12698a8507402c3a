//! The snippets of `docs/memory-tier.md`.

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::Bytes;
use burn_ckpt::ckpt_core::{Engine, SessionConfig};
use burn_ckpt::ckpt_zero::collective::{Collective, ThreadGroup};
use burn_ckpt::ckpt_zero::{MemoryTier, Partition, RankConfig, RankManager, ShardFormat};

/// "A loop of your own".
#[rustfmt::skip] // verbatim from docs/memory-tier.md
fn resume_from_the_tiers<Model: Module + 'static>(
    mut model: Model,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    session: SessionConfig,
    engine: Option<Engine>,
    mut world: ThreadGroup,
    latest: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let config = RankConfig::new("runs/x/ckpt", session)
        .shard_format(ShardFormat::PerRank)
        .memory_tier(MemoryTier::new("/dev/shm/my-run", 10).ranks_per_node(8));
    let mut ckpt = RankManager::<Model>::start(config, engine, &mut world)?;
    if let Some(mut from) = ckpt.resume_from(latest)? {            // rank 0's newest disk checkpoint
        model = from.load_model(model)?;                           // disk, own part, or a peer's replica
        let shard = from.optimizer_shard(&Partition::of(&model, world.size()), world.rank())?;
        optim = optim.from_bytes(Bytes::from_bytes_vec(shard))?;
        sched = from.load_scheduler(sched)?;
        ckpt.resumed_at(from.trainer_state()?.step);               // and the data cursor, as from disk
    }
    let _ = (model, optim, sched);
    Ok(())
}

/// "Through Burn's learner".
#[rustfmt::skip] // verbatim from docs/memory-tier.md
fn learner_ranks<M: burn::train::LearnerModel>(
    train: burn::train::TrainLoader<M>,
    valid: burn::train::ValidLoader<M>,
    device: burn::tensor::Device,
    learner: burn::train::Learner<M>,
) -> anyhow::Result<()> {
    use burn::train::SupervisedTraining;
    use burn_ckpt::ckpt_zero::strategy::ZeroTrainingStrategy;
    use burn_ckpt::{EngineConfig, FrequencyPolicy};

    let zero = ZeroTrainingStrategy::new(device, 4, EngineConfig::new("runs/x/ckpt"), FrequencyPolicy::EverySteps(100))?
        .seed(42)
        .memory_tier(MemoryTier::new("/dev/shm/my-run/node-{node}", 1).ranks_per_node(2))
        .resume_latest();                                   // the newest step of either tier
    let result = SupervisedTraining::new("runs/x", train, valid)
        .with_training_strategy(zero.into_training_strategy())
        .launch(learner);
    Ok(())
}
