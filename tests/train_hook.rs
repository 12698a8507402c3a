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
use burn_ckpt::ckpt_burn::{MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, backend_rng_lock};
use burn_ckpt::ckpt_core::{self, EngineConfig, FrequencyPolicy, layout::checkpoint_dir_name};
use test_support::fs::{rewound_entries, verified_steps};
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
    // Its weights are drawn at the first forward pass, outside any seeding: see
    // `train_steps_full`.
    let _rng = backend_rng_lock();
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
    // Burn's epoch loop keys these by epoch, and their manifests say so (`ckpt ls` shows no
    // step for them).
    for c in &list {
        assert!(
            c.manifest.as_ref().is_some_and(|m| m.keyed_by_epoch()),
            "{} is not marked as keyed by epoch",
            c.path.display()
        );
    }
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
    let how = match resume {
        Some(step) => How::Checkpoint(step),
        None => How::Fresh,
    };
    train_steps_with(dir, epochs, every, how)
}

/// How a run starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    /// A fresh run.
    Fresh,
    /// A fresh run that starts over in a used root (`CkptCheckpointers::overwrite(true)`).
    Overwrite,
    /// Burn's `.checkpoint(step)`.
    Checkpoint(usize),
    /// `CkptTrainingStrategy::resume_latest()`.
    Latest,
}

fn train_steps_with(dir: &Path, epochs: usize, every: u64, how: How) -> LearningResult<Tiny> {
    train_steps_full(dir, epochs, every, how, None)
}

/// What makes a run hard to resume exactly: a shuffled loader, dropout (and the deterministic
/// mode that replays it).
#[derive(Debug, Clone, Copy)]
struct Randomness {
    shuffle: u64,
    dropout: f64,
    deterministic: Option<u64>,
}

fn train_steps_full(
    dir: &Path,
    epochs: usize,
    every: u64,
    how: How,
    random: Option<Randomness>,
) -> LearningResult<Tiny> {
    let device = Device::flex().autodiff();
    let (train, valid) = loaders(16, random.map(|r| r.shuffle));
    let resume = match how {
        How::Checkpoint(step) => Some(step),
        _ => None,
    };

    // The lines a user adds:
    let ckpt = CkptCheckpointers::open(EngineConfig::new(dir.join("ckpt")))
        .unwrap()
        .overwrite(how == How::Overwrite);
    let (model_ckpt, optim_ckpt, sched_ckpt) = ckpt.checkpointers();
    let mut strategy =
        CkptTrainingStrategy::new(device.clone(), &ckpt, FrequencyPolicy::EverySteps(every));
    if how == How::Latest {
        strategy = strategy.resume_latest();
    }
    if let Some(seed) = random.and_then(|r| r.deterministic) {
        strategy = strategy.deterministic(seed);
    }
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
    let model = Tiny::with_dropout(&device, random.map_or(0.0, |r| r.dropout));
    // Burn's backend RNG is global to the process: a run that draws from it outside the
    // deterministic mode (its lazily initialized weights at the first forward pass, dropout
    // masks) holds the lock while it trains, so that its draws never land between another
    // test's seeding and that test's pass (which hold it).
    let _rng = random
        .and_then(|r| r.deterministic)
        .is_none()
        .then(backend_rng_lock);
    let result = training.launch(learner(model));
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
    assert!(
        !m6.keyed_by_epoch(),
        "the strategy's checkpoints are keyed by step"
    );
    // trainer.bin: step 6 is 2 batches into epoch 2 (0-based 1).
    let t6 = burn_ckpt::ckpt_burn::load_trainer_state(&root.join(checkpoint_dir_name(6))).unwrap();
    assert_eq!((t6.step, t6.epoch, t6.cursor.position), (6, 1, 2));
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

#[test]
fn a_fresh_run_in_a_used_root_is_refused_before_training_and_overwrite_moves_the_old_run_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let first = train_steps(tmp.path(), 2, 3, None);
    assert!(first.error.is_none(), "{:?}", first.error);
    let m8 = read(&root, 8, MODEL_FILE);

    // A new run, not resuming, in the same root: refused before it trains a step.
    let refused = train_steps(tmp.path(), 1, 3, None);
    let err = refused
        .error
        .map(|e| e.to_string())
        .expect("must be refused");
    assert!(
        err.contains("already holds checkpoints") && err.contains("step-00000008"),
        "{err}"
    );
    assert!(
        err.contains("resume_latest") && err.contains("overwrite(true)"),
        "{err}"
    );
    assert_eq!(
        verified_steps(&root),
        [3, 4, 6, 8],
        "the old run is untouched"
    );
    assert_eq!(read(&root, 8, MODEL_FILE), m8);
    assert_eq!(
        ckpt_core::read_latest(&root).unwrap().as_deref(),
        Some("step-00000008")
    );

    // Starting over explicitly: the old run is moved aside, visibly, and `latest` names the
    // new run's newest checkpoint, never the old run's.
    let over = train_steps_with(tmp.path(), 1, 3, How::Overwrite);
    assert!(over.error.is_none(), "{:?}", over.error);
    assert_eq!(verified_steps(&root), [3, 4]);
    assert_eq!(
        ckpt_core::read_latest(&root).unwrap().as_deref(),
        Some("step-00000004")
    );
    let aside = rewound_entries(&root);
    assert_eq!(aside.len(), 4, "{aside:?}");
    assert!(aside[3].starts_with(".rewound-step-00000008-"), "{aside:?}");
}

#[test]
fn resuming_from_an_older_step_rewinds_the_later_timeline() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    assert!(train_steps(tmp.path(), 2, 3, None).error.is_none());
    assert_eq!(verified_steps(&root), [3, 4, 6, 8]);

    // Resume from step 4 (the end of epoch 1) with 1 epoch: nothing is left to train, and the
    // checkpoints after step 4 belong to a timeline this run abandoned.
    let r = train_steps(tmp.path(), 1, 3, Some(4));
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(verified_steps(&root), [3, 4]);
    assert_eq!(
        ckpt_core::read_latest(&root).unwrap().as_deref(),
        Some("step-00000004")
    );
    let aside = rewound_entries(&root);
    assert_eq!(aside.len(), 2, "{aside:?}");
    assert!(aside[0].starts_with(".rewound-step-00000006-"), "{aside:?}");
    // A later resume_latest() continues the current timeline.
    let again = train_steps_with(tmp.path(), 2, 3, How::Latest);
    assert!(again.error.is_none(), "{:?}", again.error);
    assert_eq!(verified_steps(&root), [3, 4, 6, 8]);
}

#[test]
fn resume_latest_needs_no_step_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    // On an empty root it is a fresh start.
    let full = train_steps_with(tmp.path(), 2, 3, How::Latest);
    assert!(full.error.is_none(), "{:?}", full.error);
    assert_eq!(verified_steps(&root), [3, 4, 6, 8]);
    let want: Vec<Vec<u8>> = [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE]
        .iter()
        .map(|f| read(&root, 8, f))
        .collect();

    // As if the run had died during step 7.
    std::fs::remove_dir_all(root.join(checkpoint_dir_name(8))).unwrap();
    let resumed = train_steps_with(tmp.path(), 2, 3, How::Latest);
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
    assert_eq!(verified_steps(&root), [3, 4, 6, 8]);
    for (f, want) in [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE].iter().zip(want) {
        assert!(
            read(&root, 8, f) == want,
            "{f} differs from the uninterrupted run"
        );
    }
    assert!(rewound_entries(&root).is_empty());
}

#[test]
fn a_checkpoint_number_naming_no_checkpoint_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(train_steps(tmp.path(), 1, 3, None).error.is_none());
    // Burn's `load_checkpoint` panics on any restore error (`expect`), before the strategy
    // runs; the message is ours and says what to pass instead.
    let Err(panic) = std::panic::catch_unwind(|| train_steps(tmp.path(), 1, 3, Some(2))) else {
        panic!("Burn panics on a failed restore");
    };
    let msg = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains("holds no checkpoint step-00000002") && msg.contains("the newest is 4"),
        "{msg}"
    );
    assert!(msg.contains("resume_latest"), "{msg}");
}

/// Copies the checkpoints of `from` up to `step` into a fresh root `to`, as if the run had
/// died right after publishing `step`.
fn crashed_copy(from: &Path, to: &Path, step: u64) {
    std::fs::create_dir_all(to).unwrap();
    for s in verified_steps(from).into_iter().filter(|s| *s <= step) {
        let (a, b) = (
            from.join(checkpoint_dir_name(s)),
            to.join(checkpoint_dir_name(s)),
        );
        std::fs::create_dir(&b).unwrap();
        for e in std::fs::read_dir(&a).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), b.join(e.file_name())).unwrap();
        }
    }
}

fn assert_same_final(a: &Path, b: &Path, step: u64, what: &str) {
    for f in [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE] {
        assert!(
            read(a, step, f) == read(b, step, f),
            "{what}: {f} of step {step} differs from the uninterrupted run's"
        );
    }
}

#[test]
fn a_shuffled_loader_and_dropout_resume_exactly_at_any_point() {
    let tmp = tempfile::tempdir().unwrap();
    let random = Randomness {
        shuffle: 3,
        dropout: 0.3,
        deterministic: Some(11),
    };
    // 3 epochs of 4 steps; checkpoints every 3 steps and at every epoch end.
    let full = tmp.path().join("full");
    let r = train_steps_full(&full, 3, 3, How::Fresh, Some(random));
    assert!(r.error.is_none(), "{:?}", r.error);
    let root = full.join("ckpt");
    assert_eq!(verified_steps(&root), [3, 4, 6, 8, 9, 12]);

    // Mid-epoch 1, mid-epoch 2, right after the end of epoch 2, mid-epoch 3.
    for k in [3, 6, 8, 9] {
        let run = tmp.path().join(format!("resumed-{k}"));
        crashed_copy(&root, &run.join("ckpt"), k);
        let r = train_steps_full(&run, 3, 3, How::Latest, Some(random));
        assert!(r.error.is_none(), "resume from {k}: {:?}", r.error);
        assert_same_final(
            &root,
            &run.join("ckpt"),
            12,
            &format!("resumed from step {k}"),
        );
    }
}

#[test]
fn without_deterministic_mode_dropout_does_not_replay() {
    // The control: the same resume, dropout not re-seeded, ends elsewhere (so the test above
    // can fail).
    let tmp = tempfile::tempdir().unwrap();
    let random = Randomness {
        shuffle: 3,
        dropout: 0.3,
        deterministic: None,
    };
    let full = tmp.path().join("full");
    assert!(
        train_steps_full(&full, 3, 3, How::Fresh, Some(random))
            .error
            .is_none()
    );
    let run = tmp.path().join("resumed");
    crashed_copy(&full.join("ckpt"), &run.join("ckpt"), 6);
    assert!(
        train_steps_full(&run, 3, 3, How::Latest, Some(random))
            .error
            .is_none()
    );
    assert_ne!(
        read(&full.join("ckpt"), 12, MODEL_FILE),
        read(&run.join("ckpt"), 12, MODEL_FILE)
    );
}
