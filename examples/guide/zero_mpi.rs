//! The snippets of `docs/zero-mpi.md`.

use std::time::{Duration, Instant};

use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Device;
use burn::train::{Learner, LearnerModel, SupervisedTraining, TrainLoader, ValidLoader};
use burn_ckpt::ckpt_burn::{DataCursor, TrainerState};
use burn_ckpt::{EngineConfig, FrequencyPolicy};

/// "Through Burn's learner (rank threads)".
#[rustfmt::skip] // verbatim from docs/zero-mpi.md
fn learner_ranks<M: LearnerModel>(
    train: TrainLoader<M>,
    valid: ValidLoader<M>,
    device: Device,
    learner: Learner<M>,
) -> anyhow::Result<()> {
    use burn_ckpt::ckpt_zero::{ShardFormat, strategy::ZeroTrainingStrategy};
    use burn_ckpt::{EngineConfig, FrequencyPolicy, Retention};

    let config = EngineConfig::new("runs/x/ckpt").retention(Retention::keep_last(3));
    let zero = ZeroTrainingStrategy::new(device, 4, config, FrequencyPolicy::EverySteps(100))?
        .seed(42)                                   // required when checkpointing
        .shard_format(ShardFormat::PerRank)         // default: ShardFormat::Consolidated
        .resume_latest();                           // newest valid checkpoint, on any rank count
    let result = SupervisedTraining::new("runs/x", train, valid)
        .with_training_strategy(zero.into_training_strategy())
        .launch(learner);
    Ok(())
}

/// "Under MPI": a loop of your own on MPI ranks.
#[cfg(feature = "mpi")]
#[rustfmt::skip] // verbatim from docs/zero-mpi.md
fn mpi_loop<M: Module + 'static>(
    mut model: M,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    steps: u64,
    seed: u64,
    forward_backward: impl Fn(&M) -> GradientsParams,
) -> anyhow::Result<()> {
    use burn_ckpt::ckpt_core::SessionConfig;
    use burn_ckpt::ckpt_zero::collective::Collective;
    use burn_ckpt::ckpt_zero::collective::mpi::{self, MpiGroup};
    use burn_ckpt::ckpt_zero::{RankConfig, RankManager, ShardFormat, ShardJob, ShardSave, ShardedRoot, Zero1};

    let mut world = MpiGroup::world(Duration::from_secs(60))?;   // main thread, every rank
    let rank = world.rank();
    let engine = if rank == 0 {
        let mut root = ShardedRoot::open(EngineConfig::new("runs/x/ckpt"))?;   // the lock, recovery
        root.settle(false, false)?;                              // a root holding checkpoints is refused
        Some(root.into_engine())
    } else { None };
    let session = SessionConfig::new(FrequencyPolicy::EverySteps(100)).end_step(steps);
    let config = RankConfig::new("runs/x/ckpt", session).shard_format(ShardFormat::PerRank);
    let mut ckpt = RankManager::start(config, engine, &mut world)?;  // splits off the checkpoint group
    let mut zero = Zero1::new(&model, Box::new(world));
    for step in 1..=steps {
        let t = Instant::now();
        let grads = forward_backward(&model);
        model = zero.step(&mut optim, sched.step(), model, grads)?;
        let b = ckpt.step(step, t.elapsed(), false, zero.group(), || {   // every rank, every step
            let trainer = TrainerState::new(step, DataCursor::default(), seed);
            let model = (rank == 0).then(|| model.clone().into());
            ShardSave::Now(ShardJob { model, optim: optim.clone().into(), scheduler: sched.to_record(), trainer })
        })?;                                                     // a failed save comes back here
        if b.stop { break; }                                     // the last step, or a stop on any rank
    }
    ckpt.finish()?;                                              // every save published
    drop(zero);
    mpi::finalize()?;                                            // else mpirun reports an abnormal exit
    Ok(())
}
