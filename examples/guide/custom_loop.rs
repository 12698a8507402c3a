//! The snippets of `docs/custom-loop.md`.

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Device;
use burn_ckpt::ckpt_burn::ResumableDataLoader;
use burn_ckpt::{CheckpointManager, DataCursor, EngineConfig, Retention};

/// "The loop".
#[rustfmt::skip] // verbatim from docs/custom-loop.md
#[allow(clippy::too_many_arguments)]
fn the_loop<M: Module + 'static, I: Send + Sync + 'static, O: Send + 'static>(
    mut model: M,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    loader: ResumableDataLoader<I, O>,
    device: Device,
    steps: u64,
    seed: u64,
    forward_backward: impl Fn(&M, O) -> GradientsParams,
) -> anyhow::Result<()> {
    use burn_ckpt::ckpt_burn::{ResumableDataLoader, step_seed};
    use burn_ckpt::{CheckpointManager, ManagerConfig};

    let config = ManagerConfig::new("runs/x").every_steps(100).end_step(steps).seed(seed);
    let mut ckpt = CheckpointManager::open(config)?;
    let start = match ckpt.resume(&mut model, &mut optim, &mut sched)? {
        Some(state) => {
            loader.set_cursor(state.cursor)?;            // the batch the interrupted run was at
            state.step
        }
        None => 0,
    };
    for step in start + 1..=steps {
        device.seed(step_seed(seed, step));              // dropout replays after a resume
        let (_epoch, batch) = loader.next_batch()?;
        let grads = forward_backward(&model, batch);
        let lr = sched.step();
        ckpt.before_update();                            // a no-op on the CPU by default
        model = optim.step(lr, model, grads);
        if ckpt.step(step, &model, &optim, &sched, loader.cursor())? { break; }
    }
    let report = ckpt.finish()?;
    Ok(())
}

/// "The data position and the RNG".
#[rustfmt::skip] // verbatim from docs/custom-loop.md
fn resumable_loader<I: Send + Sync + 'static, O: Send + 'static>(
    dataset: Arc<dyn Dataset<I>>,
    batcher: Arc<dyn Batcher<I, O>>,
    device: Device,
    seed: u64,
) -> anyhow::Result<ResumableDataLoader<I, O>> {
    let loader = ResumableDataLoader::new(dataset, batcher, 32, seed, device.clone())?;
    Ok(loader)
}

/// "The report".
#[rustfmt::skip] // verbatim from docs/custom-loop.md
fn the_report(ckpt: CheckpointManager) -> anyhow::Result<()> {
    let report = ckpt.finish()?;
    for save in &report.session.saves {
        println!("step {}: stall {:.2} ms, {} bytes", save.step, save.stall_ms, save.bytes);
    }
    println!("lost to checkpoints: {:.0} ms", report.session.lost.total_ms);
    std::fs::write("runs/x/report.json", serde_json::to_vec_pretty(&report)?)?;
    Ok(())
}

/// "The engine underneath".
#[rustfmt::skip] // verbatim from docs/custom-loop.md
fn the_engine_underneath<M: Module + 'static>(
    model: M,
    optim: ModuleOptimizer,
    sched: ModuleLrScheduler,
    step: u64,
    cursor: DataCursor,
    seed: u64,
) -> anyhow::Result<()> {
    use burn_ckpt::ckpt_burn::{FrozenState, TrainerState};
    use burn_ckpt::ckpt_core::Engine;

    let (mut engine, recovery) = Engine::open(EngineConfig::new("runs/x").retention(Retention::keep_last(3)))?;
    // At a step boundary: handle clones here, staging and writing in the background.
    let frozen = FrozenState::capture(&model, &optim, &sched, TrainerState::new(step, cursor, seed));
    engine.submit(frozen.into_snapshot())?;
    for event in engine.poll()? {
        println!("published {} ({} bytes)", event.path.display(), event.bytes);
    }
    let summary = engine.finish()?;                      // waits for the rest; the first error
    Ok(())
}
