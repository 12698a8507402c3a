//! ZeRO-1 inside Burn's learner (`ZeroTrainingStrategy` through
//! `SupervisedTraining::with_training_strategy`): 2 ranks with replicated data publish the
//! bytes of 1 rank at every step checkpoint; per-rank checkpoints resume on another number of
//! ranks; stock Burn loads the files.

use std::path::Path;

use burn::module::Module;
use burn::optim::OptimizerRecord;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::store::ModuleRecord;
use burn::tensor::Device;
use burn::train::{SupervisedTraining, metric::LossMetric};
use ckpt_burn::{MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, SaveTuning, UpdateWait, assign_param_ids};
use ckpt_core::{EngineConfig, FrequencyPolicy};
use ckpt_zero::strategy::{FP_BEFORE_RECORDS, ZeroTrainingStrategy};
use ckpt_zero::{RankReport, ShardFormat};
use test_support::fs::step_dir;
use test_support::tiny::{Tiny, learner, loaders};

/// The model every rank starts from: the backend RNG seeded with 3, parameter ids from seed 3.
fn tiny(device: &Device) -> Tiny {
    assign_param_ids(Tiny::seeded(device, 3), 3)
}

/// Trains `epochs` epochs on `ranks` ranks, checkpointing every 3 optimizer steps.
fn train(
    root: &Path,
    ranks: usize,
    epochs: usize,
    format: ShardFormat,
    replicate: bool,
    resume: bool,
) {
    train_with(root, ranks, epochs, format, replicate, resume, 3, None);
}

/// [`train`] checkpointing every `every` steps, or under an overhead `budget`.
#[allow(clippy::too_many_arguments)]
fn train_with(
    root: &Path,
    ranks: usize,
    epochs: usize,
    format: ShardFormat,
    replicate: bool,
    resume: bool,
    every: u64,
    budget: Option<f64>,
) {
    let device = Device::flex().autodiff();
    let (train, valid) = loaders(8, None);
    let learner = learner(tiny(&device));

    // The lines a user adds:
    let policy = match (budget, every) {
        (Some(b), _) => FrequencyPolicy::budget(b),
        (None, 0) => FrequencyPolicy::Never,
        (None, n) => FrequencyPolicy::EverySteps(n),
    };
    let mut zero = ZeroTrainingStrategy::new(device, ranks, EngineConfig::new(root), policy)
        .unwrap()
        .shard_format(format)
        .replicate_data(replicate)
        .seed(3);
    if resume {
        zero = zero.resume_latest();
    }
    let result = SupervisedTraining::new(root.join("burn"), train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .with_application_logger(None)
        .with_training_strategy(zero.into_training_strategy())
        .num_epochs(epochs)
        .launch(learner);
    assert!(result.error.is_none(), "{:?}", result.error);
}

/// Burn's backend RNG is process-global and these tests seed it to initialize identical
/// models: they must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The steps of every checkpoint under `root`, all verified.
fn published_steps(root: &Path) -> Vec<u64> {
    ckpt_core::verify_root(root)
        .unwrap()
        .iter()
        .map(|c| c.step)
        .collect()
}

/// The model, optimizer and scheduler files of `step` are the same bytes under both roots.
fn assert_same_records(a: &Path, b: &Path, step: u64) {
    for f in [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE] {
        assert_eq!(
            std::fs::read(step_dir(a, step).join(f)).unwrap(),
            std::fs::read(step_dir(b, step).join(f)).unwrap(),
            "{f} at step {step}"
        );
    }
}

/// Under an overhead budget rank 0's controller picks the steps and both ranks follow: every
/// published step holds the bytes one rank writes at that step.
#[test]
fn an_overhead_budget_on_two_ranks_publishes_steps_both_agreed_on() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    let two = tmp.path().join("two");
    // 8 epochs of 8 steps: past the controller's longest warm-up (50 steps).
    train_with(&one, 1, 8, ShardFormat::Consolidated, true, false, 1, None);
    train_with(
        &two,
        2,
        8,
        ShardFormat::Consolidated,
        true,
        false,
        0,
        Some(0.9),
    );
    let published = published_steps(&two);
    assert!(!published.is_empty());
    for step in published {
        assert_same_records(&one, &two, step);
    }
    assert!(
        ZeroTrainingStrategy::new(
            Device::flex(),
            2,
            EngineConfig::new(tmp.path().join("bad")),
            FrequencyPolicy::budget(0.0)
        )
        .is_err()
    );
}

#[test]
fn two_ranks_in_burns_learner_publish_the_bytes_of_one() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    let two = tmp.path().join("two");
    train(&one, 1, 2, ShardFormat::Consolidated, true, false);
    train(&two, 2, 2, ShardFormat::Consolidated, true, false);
    // 64 samples in batches of 8: 8 steps an epoch, checkpoints at 3, 6, ..., 15.
    let published = published_steps(&two);
    assert_eq!(published, vec![3, 6, 9, 12, 15]);
    for step in [3, 9, 15] {
        assert_same_records(&one, &two, step);
        let d = step_dir(&two, step);
        tiny(&Device::flex()).load_record(ModuleRecord::load(d.join(MODEL_FILE)).unwrap());
        OptimizerRecord::load(d.join(OPTIM_FILE)).unwrap();
        LrSchedulerRecord::load(d.join(SCHEDULER_FILE)).unwrap();
    }
    assert_ne!(
        std::fs::read(step_dir(&two, 3).join(MODEL_FILE)).unwrap(),
        std::fs::read(step_dir(&two, 15).join(MODEL_FILE)).unwrap()
    );
}

#[test]
fn per_rank_checkpoints_from_the_learner_resume_on_one_rank() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("zero");
    // Each of 2 ranks reads half the data: 4 steps an epoch, checkpoints at 3 and 6.
    train(&root, 2, 2, ShardFormat::PerRank, false, false);
    let m = ckpt_core::verify_checkpoint(&step_dir(&root, 6)).unwrap();
    assert_eq!((m.world_size, m.layout.as_str()), (2, "per-rank"));
    assert!(m.file("optim.rank-1-of-2.bpk").is_some());
    // Resume on one rank, which reads all the data (8 steps an epoch): epoch 2 goes on after
    // the 2 iterations step 6 had done (steps 7-12), then epoch 3 (steps 13-20).
    train(&root, 1, 3, ShardFormat::Consolidated, false, true);
    let steps = published_steps(&root);
    assert_eq!(steps, vec![3, 6, 9, 12, 15, 18]);
    let m = ckpt_core::verify_checkpoint(&step_dir(&root, 18)).unwrap();
    assert_eq!((m.world_size, m.layout.as_str()), (1, "consolidated"));
}

#[test]
fn a_fresh_run_in_a_used_root_is_refused_and_overwrite_moves_the_old_run_aside() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("zero");
    train(&root, 2, 2, ShardFormat::Consolidated, false, false);
    assert_eq!(published_steps(&root), vec![3, 6]);
    let launch = |overwrite: bool| {
        let device = Device::flex().autodiff();
        let (train, valid) = loaders(8, None);
        let zero = ZeroTrainingStrategy::new(
            device.clone(),
            2,
            EngineConfig::new(&root),
            FrequencyPolicy::EverySteps(3),
        )
        .unwrap()
        .seed(3)
        .overwrite(overwrite);
        SupervisedTraining::new(root.join("burn"), train, valid)
            .with_application_logger(None)
            .with_training_strategy(zero.into_training_strategy())
            .num_epochs(1)
            .launch(learner(tiny(&device)))
    };
    let refused = launch(false);
    let err = refused.error.map(|e| e.to_string()).expect("refused");
    assert!(
        err.contains("already holds checkpoints") && err.contains("overwrite(true)"),
        "{err}"
    );
    assert_eq!(
        published_steps(&root),
        vec![3, 6],
        "the old run is untouched"
    );

    let over = launch(true);
    assert!(over.error.is_none(), "{:?}", over.error);
    assert_eq!(published_steps(&root), vec![3]);
    let aside = test_support::fs::rewound_entries(&root).len();
    assert_eq!(aside, 2);
}

/// With the memory tier saving every step between disk saves every 4, each update waits for
/// the newest save's records (taken 700 ms late): a wait that follows a memory save newer than
/// the newest disk save counts in that memory save's stall, not in the disk save's.
#[test]
fn an_update_wait_counts_in_the_stall_of_the_save_it_waited_for() {
    use ckpt_zero::MemoryTier;
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let tier = MemoryTier::new(tmp.path().join("tier/node-{node}"), 1).no_budget();
    let report = with_late_records(&tmp.path().join("zero"), 4, 1, |z| z.memory_tier(tier));
    let disk = stalls(&report);
    let memory = report.memory.expect("the tier's report").stall_ms;
    // Step 4's update waits for the disk save of step 4 (and the memory save of the same
    // step), never for a later save: about one delay each.
    for &(step, ms) in &disk {
        assert!(
            ms < 1200.0,
            "disk save {step}: {ms} ms, more than one wait: {disk:?}, memory {memory:?}"
        );
    }
    // The memory saves at steps 1-3 and 5-7 (those not skipped while the previous one ran)
    // are each the newest save when the next update waits.
    let waited = memory.iter().filter(|&&ms| ms >= 300.0).count();
    assert!(
        waited >= 2,
        "memory saves' stalls without their updates' waits: {memory:?}, disk {disk:?}"
    );
}

/// A strategy checkpoints one training: handed to a second launch (an `Arc` of it kept and
/// cloned), it fails that launch before any step with an error naming the root and saying
/// what to do (before: "exactly rank 0 of the checkpoint group owns the engine").
#[test]
fn a_strategy_handed_to_a_second_launch_refuses_it() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("zero");
    let device = Device::flex().autodiff();
    let zero = std::sync::Arc::new(
        ZeroTrainingStrategy::new(
            device.clone(),
            2,
            EngineConfig::new(&root),
            FrequencyPolicy::EverySteps(3),
        )
        .unwrap()
        .seed(3),
    );
    let launch = || {
        let (train, valid) = loaders(8, None);
        SupervisedTraining::new(root.join("burn"), train, valid)
            .with_application_logger(None)
            .with_training_strategy(burn::train::TrainingStrategy::Custom(zero.clone()))
            .num_epochs(1)
            .launch(learner(tiny(&device)))
    };
    let first = launch();
    assert!(first.error.is_none(), "{:?}", first.error);
    assert_eq!(published_steps(&root), vec![3]);
    let second = launch();
    let err = second.error.map(|e| e.to_string()).expect("refused");
    assert!(
        err.contains("already trained into") && err.contains(&root.display().to_string()),
        "{err}"
    );
    assert_eq!(
        published_steps(&root),
        vec![3],
        "the first run is untouched"
    );
}

#[test]
fn two_ranks_with_a_shuffled_loader_resume_mid_epoch_exactly() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let run = |root: &Path, resume: bool| {
        let device = Device::flex().autodiff();
        let (train, valid) = loaders(8, Some(3));
        let mut zero = ZeroTrainingStrategy::new(
            device.clone(),
            2,
            EngineConfig::new(root),
            FrequencyPolicy::EverySteps(3),
        )
        .unwrap()
        .seed(3);
        if resume {
            zero = zero.resume_latest();
        }
        let r = SupervisedTraining::new(root.join("burn"), train, valid)
            .with_application_logger(None)
            .with_training_strategy(zero.into_training_strategy())
            .num_epochs(3)
            .launch(learner(tiny(&device)));
        assert!(r.error.is_none(), "{:?}", r.error);
    };
    let full = tmp.path().join("full");
    run(&full, false);
    assert_eq!(published_steps(&full), vec![3, 6, 9, 12]);
    // As if the run had died after step 6 (mid-epoch 2): only steps 3 and 6 survive.
    let crashed = tmp.path().join("crashed");
    std::fs::create_dir_all(&crashed).unwrap();
    for s in [3u64, 6] {
        let (a, b) = (step_dir(&full, s), step_dir(&crashed, s));
        std::fs::create_dir(&b).unwrap();
        for e in std::fs::read_dir(&a).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), b.join(e.file_name())).unwrap();
        }
    }
    run(&crashed, true);
    assert_same_records(&full, &crashed, 12);
}

/// Rank 0's report of `epochs` epochs of 8 steps on 2 ranks, each reading the whole loader,
/// with a disk save every `every` steps (plus what `configure` adds to the strategy) whose
/// records are taken 700 ms late.
fn with_late_records(
    root: &Path,
    every: u64,
    epochs: usize,
    configure: impl FnOnce(ZeroTrainingStrategy) -> ZeroTrainingStrategy,
) -> RankReport {
    fail::cfg(FP_BEFORE_RECORDS, "sleep(700)").unwrap();
    let device = Device::flex().autodiff();
    let (train, valid) = loaders(8, None);
    let zero = ZeroTrainingStrategy::new(
        device.clone(),
        2,
        EngineConfig::new(root),
        FrequencyPolicy::EverySteps(every),
    )
    .unwrap()
    .replicate_data(true)
    .seed(3);
    let zero = configure(zero);
    let reports = zero.reports();
    let result = SupervisedTraining::new(root.join("burn"), train, valid)
        .with_application_logger(None)
        .with_training_strategy(zero.into_training_strategy())
        .num_epochs(epochs)
        .launch(learner(tiny(&device)));
    fail::remove(FP_BEFORE_RECORDS);
    assert!(result.error.is_none(), "{:?}", result.error);
    reports.rank(0).expect("rank 0's report")
}

/// The disk saves of `report`, `(step, stall_ms)`.
fn stalls(report: &RankReport) -> Vec<(u64, f64)> {
    report
        .session
        .saves
        .iter()
        .map(|s| (s.step, s.stall_ms))
        .collect()
}

/// `ckpt_burn::pinned_state_bytes()` at the start of each of rank 0's steps (its thread is the
/// launching one), on 2 ranks each reading the whole loader, 2 epochs of 8 steps, a save every
/// 2 steps whose records are taken 700 ms late ([`with_late_records`]); and rank 0's saves,
/// `(step, stall_ms)`.
fn held_at_each_step(root: &Path, tuning: SaveTuning) -> (Vec<u64>, Vec<(u64, f64)>) {
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (mine, to) = (std::thread::current().id(), samples.clone());
    test_support::tiny::on_train_step(Some(Box::new(move || {
        if std::thread::current().id() == mine {
            to.lock().unwrap().push(ckpt_burn::pinned_state_bytes());
        }
    })));
    let report = with_late_records(root, 2, 2, |z| z.tuning(tuning));
    test_support::tiny::on_train_step(None);
    (samples.lock().unwrap().clone(), stalls(&report))
}

/// By default the optimizer update after a save waits until every rank's checkpoint thread
/// has taken Burn's records of its frozen learner and given it back: the step after that
/// update starts with nothing held, and rank 0's report counts that wait in the save's stall.
/// With `UpdateWait::Never` it does not wait, and the same step starts with the learners still
/// held (updates copy them on write).
#[test]
fn by_default_the_update_after_a_save_waits_for_the_frozen_learners() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    // Saves after steps 2, 4, .., 16: step s + 1 (sample s, 0-based) starts while save s holds
    // the learners; the update of step s + 1 is the first after save s, so step s + 2 (sample
    // s + 1) starts after it.
    let (waited, saves) = held_at_each_step(&tmp.path().join("auto"), SaveTuning::default());
    assert_eq!(waited.len(), 16, "{waited:?}");
    for s in (2..16).step_by(2) {
        assert!(
            waited[s] > 0,
            "step {} started with nothing held: {waited:?}",
            s + 1
        );
        assert_eq!(
            waited[s + 1],
            0,
            "step {} started with state held: {waited:?}",
            s + 2
        );
    }
    assert_eq!(
        published_steps(&tmp.path().join("auto")),
        (2..=16).step_by(2).collect::<Vec<u64>>()
    );
    // The records are taken 700 ms late and the steps are far shorter: the update after each
    // save but the last waited most of that, in the save's stall.
    let waited_for: Vec<_> = saves.iter().filter(|(s, _)| *s < 16).collect();
    assert!(!waited_for.is_empty(), "{saves:?}");
    for (step, stall) in waited_for {
        assert!(
            *stall >= 300.0,
            "save {step}: the update's wait is not in its stall: {saves:?}"
        );
    }
    let (copied, _) = held_at_each_step(
        &tmp.path().join("never"),
        SaveTuning::default().update_wait(UpdateWait::Never),
    );
    assert!(
        (2..16).step_by(2).any(|s| copied[s + 1] > 0),
        "without the wait, no step started with state held: {copied:?}"
    );
}

/// Burn 0.22.1's autodiff graph registry deadlocks when threads run passes at once on graphs
/// that share nodes, as the ranks' learners share their parameters' nodes until the first
/// update: a backward holds its graph's lock and takes the registry's, while a forward merging
/// into that graph holds the registry's and takes the graph's. 4 ranks without the deterministic
/// mode (which serializes their passes for its own reasons) start 60 fresh runs. A deadlock
/// leaves Burn's registry locked for every later test in this process, so it aborts the process
/// with a message instead of hanging.
#[test]
fn four_ranks_without_the_deterministic_mode_never_deadlock_in_burns_autodiff() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for run in 0..60 {
            train_with(
                &root.join(format!("run-{run}")),
                4,
                1,
                ShardFormat::Consolidated,
                true,
                false,
                4,
                None,
            );
        }
        let _ = done.send(());
    });
    match finished.recv_timeout(std::time::Duration::from_secs(300)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            eprintln!(
                "60 runs of 4 ranks did not finish in 300 s: deadlocked in Burn's autodiff graph \
                 registry (rank threads running passes at once)"
            );
            std::process::abort();
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("training failed (see the panic above)")
        }
    }
}

/// `reports()`, taken before training, gives each rank's report once training has ended: rank
/// 0's saves are the steps published, and every rank has one.
#[test]
fn reports_give_each_ranks_checkpointing_after_training() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("zero");
    let device = Device::flex().autodiff();
    let (train, valid) = loaders(8, None);
    let learner = learner(tiny(&device));
    let zero = ZeroTrainingStrategy::new(
        device,
        2,
        EngineConfig::new(&root),
        FrequencyPolicy::EverySteps(3),
    )
    .unwrap()
    .replicate_data(true)
    .seed(3);
    let reports = zero.reports();
    assert!(reports.rank(0).is_none());
    let result = SupervisedTraining::new(root.join("burn"), train, valid)
        .with_application_logger(None)
        .with_training_strategy(zero.into_training_strategy())
        .num_epochs(1)
        .launch(learner);
    assert!(result.error.is_none(), "{:?}", result.error);
    let rank0 = reports.rank(0).expect("rank 0's report");
    let saved: Vec<u64> = rank0.session.saves.iter().map(|s| s.step).collect();
    assert_eq!(saved, vec![3, 6]);
    assert_eq!(saved, published_steps(&root));
    assert!(rank0.memory.is_none());
    assert!(reports.rank(1).is_some());
    assert!(reports.rank(2).is_none());
}
