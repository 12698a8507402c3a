//! The learner route as a user adopts it: `CkptTrainingStrategy` in a real
//! `SupervisedTraining::launch`, with no checkpointers registered with Burn.
//!
//! - A save freezes the learner at its step (handle clones) and its records are taken later,
//!   off the training thread: with that staging held back while training runs on, the files
//!   equal those of a run that ended at that step (nothing after it could change them).
//! - The strategy alone saves and resumes (`.checkpoint(n)` and `resume_latest()`), exactly.
//!
//! Its own test binary: the held-back staging is a process-wide failpoint.

use std::path::Path;

use burn::tensor::Device;
use burn::train::{LearningResult, SupervisedTraining, metric::LossMetric};
use burn_ckpt::ckpt_burn::checkpointers::CkptCheckpointers;
use burn_ckpt::ckpt_burn::strategy::CkptTrainingStrategy;
use burn_ckpt::ckpt_burn::{
    MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, STAGE_FAILPOINT, TRAINER_FILE, assign_param_ids,
    backend_rng_lock, encode_model,
};
use burn_ckpt::ckpt_core::{EngineConfig, FrequencyPolicy, layout::checkpoint_dir_name};
use test_support::fs::verified_steps;
use test_support::tiny::{Tiny, learner, loaders};

/// How a run starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    Fresh,
    /// Burn's `.checkpoint(step)`.
    Checkpoint(usize),
    /// `CkptTrainingStrategy::resume_latest()`.
    Latest,
}

/// The README's learner lines: the strategy only (no `with_custom_checkpointers`). 64 samples
/// in batches of 16 are 4 optimizer steps per epoch.
fn launch(dir: &Path, epochs: usize, every: u64, how: How) -> LearningResult<Tiny> {
    launch_on(Device::flex().autodiff(), dir, epochs, every, how)
}

/// [`launch`] on `device`.
fn launch_on(
    device: Device,
    dir: &Path,
    epochs: usize,
    every: u64,
    how: How,
) -> LearningResult<Tiny> {
    let (train, valid) = loaders(16, Some(7));
    let ckpt = CkptCheckpointers::open(EngineConfig::new(dir.join("ckpt"))).unwrap();
    let mut strategy =
        CkptTrainingStrategy::new(device.clone(), &ckpt, FrequencyPolicy::EverySteps(every))
            .deterministic(5);
    if how == How::Latest {
        strategy = strategy.resume_latest();
    }
    let mut training = SupervisedTraining::new(dir.join("burn"), train, valid)
        .metric_train_numeric(LossMetric::new())
        .with_training_strategy(strategy.into_training_strategy())
        .with_application_logger(None)
        .num_epochs(epochs);
    if let How::Checkpoint(step) = how {
        training = training.checkpoint(step);
    }
    // The same weights and ParamIds in every run (Burn draws them from the process-global
    // RNG, and ParamIds from an unseedable one).
    let model = {
        let _rng = backend_rng_lock();
        device.seed(11);
        assign_param_ids(Tiny::with_dropout(&device, 0.2), 11)
    };
    let result = training.launch(learner(model));
    ckpt.finish().unwrap();
    assert!(
        result.error.is_none(),
        "training failed: {:?}",
        result.error
    );
    result
}

/// Every file of checkpoint `step` in `a` and `b` is the same, byte for byte.
fn assert_same_checkpoint(a: &Path, b: &Path, step: u64, what: &str) {
    for file in [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE] {
        let read = |root: &Path| {
            std::fs::read(root.join(checkpoint_dir_name(step)).join(file))
                .unwrap_or_else(|e| panic!("{}: step {step} {file}: {e}", root.display()))
        };
        assert!(read(a) == read(b), "{what}: {file} of step {step} differs");
    }
}

/// Held-back staging while training runs on, against a run that ended at the saved step.
fn frozen_learner_is_its_step(device: fn() -> Device) {
    // The failpoint is process-wide: one such test at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    // Reference: a run that ends at step 4 (its last save, at the end of epoch 1).
    let ended = tmp.path().join("ended");
    launch_on(device(), &ended, 1, 2, How::Fresh);
    assert_eq!(verified_steps(&ended.join("ckpt")), vec![2, 4]);

    // The same run going on to step 8, every save's staging held back: Burn's records of
    // steps 2 and 4 are taken from the frozen learner while training runs steps past them.
    let held = tmp.path().join("held");
    fail::cfg(STAGE_FAILPOINT, "sleep(700)").unwrap();
    launch_on(device(), &held, 2, 2, How::Fresh);
    fail::remove(STAGE_FAILPOINT);
    assert_eq!(verified_steps(&held.join("ckpt")), vec![2, 4, 6, 8]);
    for step in [2, 4] {
        assert_same_checkpoint(
            &ended.join("ckpt"),
            &held.join("ckpt"),
            step,
            "held-back staging",
        );
    }
}

#[test]
fn a_frozen_learner_is_written_as_its_step_after_training_moved_on() {
    frozen_learner_is_its_step(|| Device::flex().autodiff());
}

/// The CubeCL path (the code CUDA runs) through wgpu on Mesa's lavapipe: records are lazy
/// device reads there, and an update writes a tensor in place when its handle is unique.
#[cfg(feature = "wgpu")]
#[test]
fn on_wgpu_a_frozen_learner_is_written_as_its_step_after_training_moved_on() {
    frozen_learner_is_its_step(|| Device::wgpu(burn::tensor::DeviceKind::DefaultDevice).autodiff());
}

#[test]
fn the_strategy_alone_saves_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    let result = launch(&full, 2, 3, How::Fresh);
    // Every 3 steps plus every epoch end.
    assert_eq!(verified_steps(&full.join("ckpt")), vec![3, 4, 6, 8]);
    // The last checkpoint's model part (written from the record Burn's call copies, on Flex)
    // is the bytes of the trained model's own record.
    let last = std::fs::read(
        full.join("ckpt")
            .join(checkpoint_dir_name(8))
            .join(MODEL_FILE),
    )
    .unwrap();
    assert!(
        last == encode_model(result.model).unwrap(),
        "the model part of step 8 is not the final model's record"
    );

    for how in [How::Checkpoint(6), How::Latest] {
        // As if the run had died during step 7: the root holds its checkpoints up to 6.
        let dir = tmp.path().join(format!("{how:?}"));
        let root = dir.join("ckpt");
        launch(&dir, 2, 3, How::Fresh);
        std::fs::remove_dir_all(root.join(checkpoint_dir_name(8))).unwrap();
        // Start-up recovery repairs `latest`, which named step 8.
        launch(&dir, 2, 3, how);
        assert_eq!(verified_steps(&root), vec![3, 4, 6, 8], "{how:?}");
        for step in [6, 8] {
            assert_same_checkpoint(&full.join("ckpt"), &root, step, &format!("{how:?}"));
        }
    }
}
