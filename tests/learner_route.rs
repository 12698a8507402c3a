//! The learner route as a user adopts it: `CkptTrainingStrategy` in a real
//! `SupervisedTraining::launch`, with no checkpointers registered with Burn.
//!
//! - A save freezes the learner at its step (handle clones) and its records are taken later,
//!   off the training thread: with that staging held back while training runs on, the files
//!   equal those of a run that ended at that step (nothing after it could change them).
//! - The strategy alone saves and resumes (`.checkpoint(n)` and `resume_latest()`), exactly.
//! - By default the update after a save waits until the save has given the learner back, so
//!   no update copies the state on write.
//!
//! Its own test binary: the held-back staging is a process-wide failpoint.

use std::path::Path;

use burn::tensor::Device;
use burn::train::{LearningResult, SupervisedTraining, metric::LossMetric};
use burn_ckpt::ckpt_burn::checkpointers::CkptCheckpointers;
use burn_ckpt::ckpt_burn::strategy::CkptTrainingStrategy;
use burn_ckpt::ckpt_burn::{
    MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, STAGE_FAILPOINT, SaveTuning, TRAINER_FILE, UpdateWait,
    assign_param_ids, backend_rng_lock, encode_model, pinned_state_bytes,
};
use burn_ckpt::ckpt_core::failpoints::WRITE_PART;
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
    launch_tuned(device, dir, epochs, every, how, SaveTuning::default())
}

/// [`launch_on`] with `tuning`.
fn launch_tuned(
    device: Device,
    dir: &Path,
    epochs: usize,
    every: u64,
    how: How,
    tuning: SaveTuning,
) -> LearningResult<Tiny> {
    let (train, valid) = loaders(16, Some(7));
    let ckpt = CkptCheckpointers::open(EngineConfig::new(dir.join("ckpt"))).unwrap();
    let mut strategy =
        CkptTrainingStrategy::new(device.clone(), &ckpt, FrequencyPolicy::EverySteps(every))
            .deterministic(5)
            .tuning(tuning);
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

/// The failpoint, the step hook and the held-state count are process-wide: one test at a
/// time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held-back staging while training runs on, against a run that ended at the saved step.
fn frozen_learner_is_its_step(device: fn() -> Device) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    // Reference: a run that ends at step 4 (its last save, at the end of epoch 1).
    let ended = tmp.path().join("ended");
    launch_on(device(), &ended, 1, 2, How::Fresh);
    assert_eq!(verified_steps(&ended.join("ckpt")), vec![2, 4]);

    // The same run going on to step 8, every save's staging and part writes held back:
    // Burn's records of steps 2 and 4 are taken from the frozen learner, and its model (on
    // Flex, written from the frozen model's own buffers) is written, while training runs steps
    // past them (updates do not wait for the save here, which by default they do).
    let held = tmp.path().join("held");
    fail::cfg(STAGE_FAILPOINT, "sleep(700)").unwrap();
    fail::cfg(WRITE_PART, "sleep(300)").unwrap();
    let never = SaveTuning::default().update_wait(UpdateWait::Never);
    launch_tuned(device(), &held, 2, 2, How::Fresh, never);
    fail::remove(STAGE_FAILPOINT);
    fail::remove(WRITE_PART);
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

/// A log writer into a shared buffer.
#[derive(Clone, Default)]
struct Logged(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The number after `field=` in `line`.
fn field(line: &str, field: &str) -> f64 {
    let at = line
        .find(&format!(" {field}="))
        .unwrap_or_else(|| panic!("no {field} in {line}"));
    line[at + field.len() + 2..]
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} is no number in {line}"))
}

/// What a run saving every 2 steps with its staging held back 700 ms (the steps far shorter)
/// shows: the state saves still held (`pinned_state_bytes`) at the start of each training
/// step, and the `checkpoint published` lines the strategy logged.
fn held_at_each_step(tuning: SaveTuning) -> (Vec<u64>, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (mine, to) = (std::thread::current().id(), samples.clone());
    test_support::tiny::on_train_step(Some(Box::new(move || {
        // Only this test's training (it runs on the launching thread).
        if std::thread::current().id() == mine {
            to.lock().unwrap().push(pinned_state_bytes());
        }
    })));
    fail::cfg(STAGE_FAILPOINT, "sleep(700)").unwrap();
    let log = Logged::default();
    let to = log.clone();
    let logger = tracing_subscriber::fmt()
        .with_writer(move || to.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .finish();
    tracing::subscriber::with_default(logger, || {
        launch_tuned(
            Device::flex().autodiff(),
            tmp.path(),
            2,
            2,
            How::Fresh,
            tuning,
        )
    });
    fail::remove(STAGE_FAILPOINT);
    test_support::tiny::on_train_step(None);
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let published = log
        .lines()
        .filter(|l| l.contains("checkpoint published"))
        .map(str::to_string)
        .collect();
    (samples.lock().unwrap().clone(), published)
}

/// By default, on host memory too, the update after a save waits until the save has taken
/// Burn's records of the frozen learner and let it go: the step after that update starts with
/// nothing held (so no update copied the state on write), and the save's published line
/// counts that wait in its stall (`update_wait_ms`). With `UpdateWait::Never` it does not
/// wait, and the same step starts with the learner still held.
#[test]
fn by_default_the_update_after_a_save_waits_for_the_learner_to_be_given_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Saves after steps 2, 4, 6 and 8; the update of step s + 1 is the first after save s,
    // so step s + 2 (sample s + 1, 0-based) starts after it.
    let (waited, published) = held_at_each_step(SaveTuning::default());
    // Each save's staging sleeps 700 ms before it takes the records, and the steps between
    // are far shorter: the update after each of saves 2, 4 and 6 waited most of that, and
    // the save's line says so (save 8 has no update after it).
    let lines: Vec<&String> = published
        .iter()
        .filter(|l| [2.0, 4.0, 6.0].contains(&field(l, "step")))
        .collect();
    assert!(
        !lines.is_empty(),
        "no save of steps 2, 4, 6 logged: {published:#?}"
    );
    for l in lines {
        let wait = field(l, "update_wait_ms");
        assert!(wait >= 300.0, "the update's wait is not counted: {l}");
        assert!(
            field(l, "stall_ms") >= wait,
            "the stall leaves out the wait: {l}"
        );
    }
    assert_eq!(waited.len(), 8, "{waited:?}");
    for s in [2, 4, 6] {
        assert_eq!(
            waited[s + 1],
            0,
            "step {} started with state held: {waited:?}",
            s + 2
        );
    }
    let (copied, published) =
        held_at_each_step(SaveTuning::default().update_wait(UpdateWait::Never));
    for l in &published {
        assert_eq!(field(l, "update_wait_ms"), 0.0, "no update waited: {l}");
    }
    assert!(
        [2, 4, 6].iter().any(|s| copied[s + 1] > 0),
        "without the wait, no step started with state held: {copied:?}"
    );
}

#[test]
fn the_strategy_alone_saves_and_resumes_exactly() {
    // Its saves' held state would show in the other tests' process-wide samples.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
