//! The learner hook: a real `SupervisedTraining::..launch(learner)` with
//! `with_custom_checkpointers(..)` from `ckpt_burn::checkpointers` publishes one atomic,
//! verifiable checkpoint directory per epoch whose files load with stock Burn, and Burn's own
//! resume path (`.checkpoint(epoch)`) reads them back through the same checkpointers.
//!
//! Burn is built without its `tui` feature, so `launch` uses the plain CLI renderer and needs no
//! terminal.

use std::path::Path;

use burn::module::Module;
use burn::optim::OptimizerRecord;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::store::ModuleRecord;
use burn::tensor::Device;
use burn::train::{LearningResult, SupervisedTraining, metric::LossMetric};
use burn_ckpt::ckpt_burn::checkpointers::{AlwaysSave, CkptCheckpointers};
use burn_ckpt::ckpt_burn::strategy::{CkptTrainingStrategy, META_EPOCH_COMPLETE};
use burn_ckpt::ckpt_burn::{MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE};
use burn_ckpt::ckpt_core::{self, EngineConfig, FrequencyPolicy, checkpoint_dir_name};
use test_support::tiny::{Tiny, learner, loaders};

/// One `launch` through the ckpt checkpointers; returns the result after `finish`.
fn train(dir: &Path, epochs: usize, resume: Option<usize>) -> LearningResult<Tiny> {
    let device = Device::flex().autodiff();
    let (train, valid) = loaders(16, Some(3));

    // The lines a user adds:
    let ckpt = CkptCheckpointers::open(EngineConfig::new(dir.join("ckpt"))).unwrap();
    let (model_ckpt, optim_ckpt, sched_ckpt) = ckpt.checkpointers();
    let mut training = SupervisedTraining::new(dir.join("burn"), train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .with_custom_checkpointers(model_ckpt, optim_ckpt, sched_ckpt)
        .with_checkpointing_strategy(AlwaysSave)
        .with_application_logger(None)
        .num_epochs(epochs);
    if let Some(epoch) = resume {
        training = training.checkpoint(epoch);
    }
    let result = training.launch(learner(Tiny::new(&device)));
    ckpt.finish().unwrap();
    result
}

fn assert_published(root: &Path, epoch: u64) {
    assert_step_published(root, epoch, epoch);
}

fn assert_step_published(root: &Path, step: u64, epoch: u64) {
    let dir = root.join(checkpoint_dir_name(step));
    let manifest = ckpt_core::verify_checkpoint(&dir).unwrap();
    assert_eq!(manifest.step, step);
    assert_eq!(manifest.epoch, epoch);
    for f in [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE] {
        assert!(manifest.file(f).is_some(), "{f} not in the manifest");
    }
    // Stock Burn loads each file.
    let model = ModuleRecord::load(dir.join(MODEL_FILE)).unwrap();
    Tiny::new(&Device::flex()).load_record(model);
    OptimizerRecord::load(dir.join(OPTIM_FILE)).unwrap();
    LrSchedulerRecord::load(dir.join(SCHEDULER_FILE)).unwrap();
}

#[test]
fn custom_checkpointers_publish_one_atomic_dir_per_epoch_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");

    let result = train(tmp.path(), 2, None);
    assert!(
        result.error.is_none(),
        "training failed: {:?}",
        result.error
    );
    let list = ckpt_core::list_checkpoints(&root, true).unwrap();
    let steps: Vec<u64> = list.iter().map(|c| c.step).collect();
    assert_eq!(steps, vec![1, 2]);
    assert_published(&root, 1);
    assert_published(&root, 2);
    assert_eq!(
        ckpt_core::read_latest(&root).unwrap().as_deref(),
        Some("step-00000002")
    );
    let model_2 = std::fs::read(root.join("step-00000002").join(MODEL_FILE)).unwrap();
    let trained_2 = result.model.into_record().into_bytes().unwrap();
    let sched_2 = std::fs::read(root.join("step-00000002").join(SCHEDULER_FILE)).unwrap();

    // Resume from epoch 1 through the same checkpointers: Burn restores the three records
    // from step-00000001 and trains epoch 2 again, which replaces step-00000002.
    let resumed = train(tmp.path(), 2, Some(1));
    assert!(
        resumed.error.is_none(),
        "resume failed: {:?}",
        resumed.error
    );
    assert_published(&root, 1);
    assert_published(&root, 2);
    let list = ckpt_core::list_checkpoints(&root, true).unwrap();
    assert_eq!(list.iter().map(|c| c.step).collect::<Vec<_>>(), vec![1, 2]);
    // The final model of the first run is what its epoch-2 checkpoint holds.
    assert_eq!(model_2, trained_2.to_vec());
    // The resumed run restored the scheduler at epoch 1 (4 steps) and stepped it 4 more times:
    // the same scheduler state as the uninterrupted run. A fresh scheduler would be at 4.
    let resumed_sched_2 = std::fs::read(root.join("step-00000002").join(SCHEDULER_FILE)).unwrap();
    assert_eq!(resumed_sched_2, sched_2);
    let sched_1 = std::fs::read(root.join("step-00000001").join(SCHEDULER_FILE)).unwrap();
    assert_ne!(sched_1, sched_2);
}

#[test]
fn restore_of_a_missing_checkpoint_is_an_error_naming_the_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = CkptCheckpointers::open(EngineConfig::new(tmp.path().join("ckpt"))).unwrap();
    let (model_ckpt, _, _) = ckpt.checkpointers();
    let Err(err) = burn::train::checkpoint::Checkpointer::<ModuleRecord>::restore(&model_ckpt, 5)
    else {
        panic!("restore of a missing checkpoint must fail");
    };
    assert!(err.to_string().contains("step-00000005"), "{err}");
    ckpt.finish().unwrap();
}

/// One `launch` with the step-level strategy (unshuffled data, so a resume sees the same
/// batches); 64 samples in batches of 16 are 4 optimizer steps per epoch.
fn train_steps(
    dir: &Path,
    epochs: usize,
    every: u64,
    resume: Option<usize>,
) -> LearningResult<Tiny> {
    let device = Device::flex().autodiff();
    let (train, valid) = loaders(16, None);

    // The lines a user adds:
    let ckpt = CkptCheckpointers::open(EngineConfig::new(dir.join("ckpt"))).unwrap();
    let (model_ckpt, optim_ckpt, sched_ckpt) = ckpt.checkpointers();
    let strategy =
        CkptTrainingStrategy::new(device.clone(), &ckpt, FrequencyPolicy::EverySteps(every));
    let mut training = SupervisedTraining::new(dir.join("burn"), train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .with_custom_checkpointers(model_ckpt, optim_ckpt, sched_ckpt)
        .with_checkpointing_strategy(AlwaysSave)
        .with_training_strategy(strategy.into_training_strategy())
        .with_application_logger(None)
        .num_epochs(epochs);
    if let Some(step) = resume {
        training = training.checkpoint(step);
    }
    let result = training.launch(learner(Tiny::new(&device)));
    ckpt.finish().unwrap();
    result
}

fn read(root: &Path, step: u64, file: &str) -> Vec<u8> {
    std::fs::read(root.join(checkpoint_dir_name(step)).join(file)).unwrap()
}

#[test]
fn strategy_checkpoints_at_step_boundaries_and_resumes_mid_epoch_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");

    // Every 3 steps (3, 6) plus every epoch end (4, 8).
    let result = train_steps(tmp.path(), 2, 3, None);
    assert!(
        result.error.is_none(),
        "training failed: {:?}",
        result.error
    );
    let list = ckpt_core::list_checkpoints(&root, true).unwrap();
    assert_eq!(
        list.iter().map(|c| c.step).collect::<Vec<_>>(),
        vec![3, 4, 6, 8]
    );
    for (step, epoch) in [(3, 1), (4, 1), (6, 2), (8, 2)] {
        assert_step_published(&root, step, epoch);
    }
    let m6 = ckpt_core::verify_checkpoint(&root.join(checkpoint_dir_name(6))).unwrap();
    assert_eq!(m6.meta[META_EPOCH_COMPLETE], false);
    let m8 = ckpt_core::verify_checkpoint(&root.join(checkpoint_dir_name(8))).unwrap();
    assert_eq!(m8.meta[META_EPOCH_COMPLETE], true);
    let model_8 = read(&root, 8, MODEL_FILE);
    let optim_8 = read(&root, 8, OPTIM_FILE);
    let sched_8 = read(&root, 8, SCHEDULER_FILE);
    assert_eq!(
        model_8,
        result.model.into_record().into_bytes().unwrap().to_vec()
    );

    // As if the run had died during step 7: step-00000008 never got published.
    std::fs::remove_dir_all(root.join(checkpoint_dir_name(8))).unwrap();

    // Resume mid-epoch 2 from step 6: Burn restores the records through the checkpointers, the
    // strategy skips the 2 batches of epoch 2 already trained and runs steps 7 and 8. The
    // result equals the uninterrupted run bit for bit.
    let resumed = train_steps(tmp.path(), 2, 3, Some(6));
    assert!(
        resumed.error.is_none(),
        "resume failed: {:?}",
        resumed.error
    );
    let list = ckpt_core::list_checkpoints(&root, true).unwrap();
    assert_eq!(
        list.iter().map(|c| c.step).collect::<Vec<_>>(),
        vec![3, 4, 6, 8]
    );
    assert_step_published(&root, 8, 2);
    assert_eq!(read(&root, 8, SCHEDULER_FILE), sched_8);
    assert_eq!(read(&root, 8, OPTIM_FILE), optim_8);
    assert_eq!(read(&root, 8, MODEL_FILE), model_8);
}

#[test]
fn a_checkpoint_the_strategy_cannot_resume_from_is_an_error_naming_it() {
    use burn_ckpt::ckpt_burn::strategy::META_EPOCH_ITERATION;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let result = train_steps(tmp.path(), 1, 3, None);
    assert!(result.error.is_none(), "{:?}", result.error);

    // Step 3's records, published again as step 20 with a position Burn's loop cannot mean.
    let (mut engine, _) = ckpt_core::Engine::open(EngineConfig::new(&root)).unwrap();
    let snap = ckpt_core::Snapshot::new(20)
        .with_epoch(1)
        .with_bytes(MODEL_FILE, read(&root, 3, MODEL_FILE))
        .with_bytes(OPTIM_FILE, read(&root, 3, OPTIM_FILE))
        .with_bytes(SCHEDULER_FILE, read(&root, 3, SCHEDULER_FILE))
        .with_meta(META_EPOCH_ITERATION, "three");
    engine.submit(snap).unwrap();
    engine.finish().unwrap();

    // Burn restores the records fine; the strategy refuses instead of silently starting over
    // at step 0 (whose later saves would replace steps 3 and 4).
    let m3 = read(&root, 3, MODEL_FILE);
    let resumed = train_steps(tmp.path(), 2, 3, Some(20));
    let err = resumed
        .error
        .map(|e| e.to_string())
        .expect("resume must fail");
    assert!(err.contains(&checkpoint_dir_name(20)), "{err}");
    assert!(err.contains(META_EPOCH_ITERATION), "{err}");
    let list = ckpt_core::list_checkpoints(&root, true).unwrap();
    assert_eq!(
        list.iter().map(|c| c.step).collect::<Vec<_>>(),
        vec![3, 4, 20]
    );
    assert_eq!(read(&root, 3, MODEL_FILE), m3);
}
