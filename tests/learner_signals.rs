//! Preemption and crashes on the learner route: a Burn program (`SupervisedTraining` with a
//! shuffled loader, dropout, AdamW, a cosine schedule and metrics, checkpointing through
//! `CkptTrainingStrategy`) runs as a child process. SIGTERM stops it at a step boundary with a
//! final checkpoint that is durable when it exits; a real `abort()` at three points (mid-epoch
//! 1, mid-epoch 2, right after the end of epoch 2) kills it. Resumed with the README's lines,
//! each run ends byte-identical to an uninterrupted one.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::{Dataset, DatasetError, InMemDataset};
use burn::tensor::Device;
use burn::train::{LearningResult, SupervisedTraining, metric::LossMetric};
use burn_ckpt::ckpt_burn::checkpointers::{AlwaysSave, CkptCheckpointers};
use burn_ckpt::ckpt_burn::stop::StopOnSignal;
use burn_ckpt::ckpt_burn::strategy::{CkptTrainingStrategy, META_EPOCH_COMPLETE};
use burn_ckpt::ckpt_burn::{MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE};
use burn_ckpt::ckpt_core::{self, EngineConfig, FrequencyPolicy, layout::checkpoint_dir_name};
use test_support::fs::{At, flip_byte, step_dir, verified_steps};
use test_support::tiny::{Sample, Tiny, TinyBatcher, data, learner, loaders};

/// Environment variable: run the Burn program on this directory, with this many epochs.
const CHILD: &str = "BURN_CKPT_LEARNER_SIGNAL_CHILD";
/// Exit status of the program after a signal, with its final checkpoint durable.
const EXIT_STOPPED: i32 = 75;

/// Environment variable: the child aborts the process 10 ms after its checkpoint of step N is
/// published (training is then a little past step N, whatever the machine's speed), and never
/// exits before: on a busy machine step N may be published only as training ends.
const ABORT_AT: &str = "BURN_CKPT_LEARNER_ABORT_AFTER_STEP";

/// The data set, 2 ms per sample, so the program runs long enough to be signalled.
struct Slow(InMemDataset<Sample>);

impl Dataset<Sample> for Slow {
    fn get(&self, index: usize) -> Result<Sample, DatasetError> {
        std::thread::sleep(Duration::from_millis(2));
        self.0.get(index)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Environment variable: the child trains on wgpu (Mesa's lavapipe here), not Flex.
#[cfg(feature = "wgpu")]
const ON_WGPU: &str = "BURN_CKPT_LEARNER_WGPU";

/// The backend device of this process's runs.
fn base_device() -> Device {
    #[cfg(feature = "wgpu")]
    if std::env::var(ON_WGPU).is_ok() {
        return Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    }
    Device::flex()
}

/// The same initial weights in every run: the backend RNG (process-global, and other tests of
/// this process train beside this one) seeded under the lock the deterministic strategies hold.
fn init(device: &Device) -> Tiny {
    let _rng = burn_ckpt::ckpt_burn::backend_rng_lock();
    device.seed(5);
    burn_ckpt::ckpt_burn::assign_param_ids(Tiny::with_dropout(device, 0.3), 5)
}

/// The program: what a user writes, plus the stop handler.
fn program(dir: &Path, epochs: usize, signals: bool) -> (LearningResult<Tiny>, Option<i32>) {
    program_on(base_device(), dir, epochs, signals)
}

fn program_on(
    device: Device,
    dir: &Path,
    epochs: usize,
    signals: bool,
) -> (LearningResult<Tiny>, Option<i32>) {
    let device = device.autodiff();
    let train = DataLoaderBuilder::new(TinyBatcher)
        .batch_size(16)
        .shuffle(3)
        .num_workers(1)
        .build(Slow(InMemDataset::new(data())));
    let valid = DataLoaderBuilder::new(TinyBatcher)
        .batch_size(16)
        .build(InMemDataset::new(data()));
    let ckpt = CkptCheckpointers::open(EngineConfig::new(dir.join("ckpt"))).unwrap();
    let (m, o, s) = ckpt.checkpointers();
    let strategy = CkptTrainingStrategy::new(device.clone(), &ckpt, FrequencyPolicy::EverySteps(3))
        .resume_latest()
        .deterministic(11);
    let training = SupervisedTraining::new(dir.join("burn"), train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .with_custom_checkpointers(m, o, s)
        .with_checkpointing_strategy(AlwaysSave)
        .with_training_strategy(strategy.into_training_strategy())
        .num_epochs(epochs);
    // Burn's default application logger (`experiment.log`) is process-global: only the child
    // of the logging test installs it.
    let training = if std::env::var(LOGGED).is_ok() {
        training
    } else {
        training.with_application_logger(None)
    };
    let stop = signals.then(|| StopOnSignal::install(training.interrupter()).unwrap());
    // ParamIds are random per process in Burn: derive them from a seed, so an independent
    // uninterrupted run writes comparable bytes (a resume restores them from the checkpoint).
    let model = init(&device);
    let result = training.launch(learner(model));
    ckpt.finish_within(Duration::from_secs(30)).unwrap();
    (result, stop.and_then(|s| s.received()))
}

/// Environment variable: the child runs [`epoch_program`] (the checkpointers alone in Burn's
/// own epoch loop, Burn's default application logger kept).
const EPOCH_ROUTE: &str = "BURN_CKPT_LEARNER_EPOCH_ROUTE";

/// The docs' epoch route: the three checkpointers alone, in Burn's own epoch loop.
fn epoch_program(dir: &Path, epochs: usize) -> LearningResult<Tiny> {
    let device = base_device().autodiff();
    let (train, valid) = loaders(16, Some(3));
    let ckpt = CkptCheckpointers::open(EngineConfig::new(dir.join("ckpt"))).unwrap();
    let (m, o, s) = ckpt.checkpointers();
    let result = SupervisedTraining::new(dir.join("burn"), train, valid)
        .with_custom_checkpointers(m, o, s)
        .with_checkpointing_strategy(AlwaysSave)
        .num_epochs(epochs)
        .launch(learner(init(&device)));
    ckpt.finish().unwrap();
    result
}

/// The line the checkpointers log at the first save of Burn's own epoch loop.
const EPOCH_ROUTE_NOTICE: &str = "epoch checkpoints through Burn's own loop";

/// Environment variable: the child keeps Burn's default application logger.
const LOGGED: &str = "BURN_CKPT_LEARNER_LOGGED";

/// Environment variable: the child runs [`zero_program`] (2 ZeRO-1 ranks), not [`program`].
const ZERO: &str = "BURN_CKPT_LEARNER_ZERO";

/// The same program on 2 ZeRO-1 rank threads (`ZeroTrainingStrategy`), checkpointing every 2
/// optimizer steps (each rank reads half of the data: 4 steps per epoch), with the README's
/// lines: `.deterministic(seed)` and `.resume_latest()`.
fn zero_program(dir: &Path, epochs: usize) -> LearningResult<Tiny> {
    zero_program_with(dir, epochs, false)
}

/// Environment variable: the child's [`zero_program`] keeps a memory tier
/// ([`zero_program_with`]), logs to stderr, and with [`ABORT_AT`] aborts after the tier's save
/// of that step instead of the disk's.
const MEMORY: &str = "BURN_CKPT_LEARNER_MEMORY_TIER";

/// [`zero_program`]; with `memory`, disk saves every 4 steps and a memory tier saving every
/// step (no budget) in `dir/tier/node-{node}`, each rank its own node.
fn zero_program_with(dir: &Path, epochs: usize, memory: bool) -> LearningResult<Tiny> {
    use burn_ckpt::ckpt_zero::MemoryTier;
    use burn_ckpt::ckpt_zero::strategy::ZeroTrainingStrategy;
    let device = Device::flex().autodiff();
    let train = DataLoaderBuilder::new(TinyBatcher)
        .batch_size(8)
        .shuffle(3)
        .num_workers(1)
        .build(Slow(InMemDataset::new(data())));
    let valid = DataLoaderBuilder::new(TinyBatcher)
        .batch_size(16)
        .build(InMemDataset::new(data()));
    let zero = ZeroTrainingStrategy::new(
        device.clone(),
        2,
        EngineConfig::new(dir.join("ckpt")),
        FrequencyPolicy::EverySteps(if memory { 4 } else { 2 }),
    )
    .unwrap()
    .deterministic(11)
    .resume_latest();
    let zero = match memory {
        true => zero.memory_tier(MemoryTier::new(dir.join("tier/node-{node}"), 1).no_budget()),
        false => zero,
    };
    let training = SupervisedTraining::new(dir.join("burn"), train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .with_training_strategy(zero.into_training_strategy())
        .with_application_logger(None)
        .num_epochs(epochs);
    let model = init(&device);
    training.launch(learner(model))
}

#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (dir, epochs) = spec.split_once('|').unwrap();
    let memory = std::env::var(MEMORY).is_ok();
    if memory {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter("info")
            .init();
        // Every memory save is waited for: the tier holds the step aborted after, and the
        // abort comes on the training thread once that save is done, before the next step
        // (a watcher thread raced the next step's disk save).
        let action = match std::env::var(ABORT_AT) {
            Ok(step) => format!("return({step})"),
            Err(_) => "return".into(),
        };
        fail::cfg("memory_tier_wait", &action).unwrap();
    }
    if let (Ok(step), false) = (std::env::var(ABORT_AT), memory) {
        let name = checkpoint_dir_name(step.parse().unwrap());
        let root = Path::new(dir).to_path_buf();
        let published = move || root.join("ckpt").join(&name).exists();
        std::thread::spawn(move || {
            while !published() {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(10));
            std::process::abort();
        });
    }
    // An abort requested after step N must come whatever the timing: where step N is published
    // only as training ends (a slow persist), the child waits for it instead of exiting.
    let await_abort = || {
        if std::env::var(ABORT_AT).is_ok() {
            std::thread::sleep(Duration::from_secs(60));
            eprintln!("the step to abort after was never published");
            std::process::exit(3);
        }
    };
    if std::env::var(EPOCH_ROUTE).is_ok() {
        let result = epoch_program(Path::new(dir), epochs.parse().unwrap());
        if let Some(e) = result.error {
            eprintln!("training failed: {e}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    if std::env::var(ZERO).is_ok() {
        let result = zero_program_with(Path::new(dir), epochs.parse().unwrap(), memory);
        await_abort();
        if let Some(e) = result.error {
            eprintln!("training failed: {e}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let (result, signal) = program(Path::new(dir), epochs.parse().unwrap(), true);
    await_abort();
    if let Some(e) = result.error {
        eprintln!("training failed: {e}");
        std::process::exit(1);
    }
    if let Some(sig) = signal {
        eprintln!("stopped by signal {sig}; final checkpoint durable");
        std::process::exit(EXIT_STOPPED);
    }
    std::process::exit(0);
}

/// The child exited with status 0 (its status and stderr otherwise).
fn assert_exited_ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs this test binary's [`child_entry`] on `dir` for `epochs` epochs, with `env` set, to
/// its end.
fn run_child(dir: &Path, epochs: usize, env: &[(&str, String)]) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{}|{epochs}", dir.display()))
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The model, optimizer and scheduler files of `step` are the same bytes under roots `a` and
/// `b`; `context` says which run `b` is.
fn assert_same_records(a: &Path, b: &Path, step: u64, context: &str) {
    for f in [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE] {
        let x = std::fs::read(step_dir(a, step).join(f)).unwrap();
        let y = std::fs::read(step_dir(b, step).join(f)).unwrap();
        assert!(x == y, "{f} at step {step} differs {context}");
    }
}

#[test]
fn sigterm_stops_the_learner_with_a_durable_final_checkpoint_that_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let root = dir.join("ckpt");
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{}|1000", dir.display()))
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Signal it once it has published its first checkpoint (step 3, mid-epoch 1).
    let t0 = Instant::now();
    while !root.join(checkpoint_dir_name(3)).exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no checkpoint yet");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(150));
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{stderr}");

    // The final checkpoint is the newest, durable and valid, written at the step boundary
    // where training stopped (not an epoch end), and `latest` names it.
    let list = verified_steps(&root);
    let last = *list.last().unwrap();
    assert!(last < 4000, "stopped long before the end: {list:?}");
    let m = ckpt_core::verify_checkpoint(&root.join(checkpoint_dir_name(last))).unwrap();
    assert_eq!(
        ckpt_core::read_latest(&root).unwrap(),
        Some(checkpoint_dir_name(last))
    );
    let epoch = m.epoch as usize;
    let complete = m.meta[META_EPOCH_COMPLETE].as_bool().unwrap();

    // Resume (same program, resume_latest) to the end of the next epoch, and compare with an
    // uninterrupted run of as many epochs.
    let epochs = epoch + 1;
    let (resumed, _) = program(&dir, epochs, false);
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
    let base = tmp.path().join("base");
    let (full, _) = program(&base, epochs, false);
    assert!(full.error.is_none(), "{:?}", full.error);
    let end = 4 * epochs as u64;
    assert_same_records(
        &base.join("ckpt"),
        &root,
        end,
        &format!("after a stop at step {last} (epoch {epoch}, complete {complete})"),
    );
}

#[test]
fn a_real_abort_at_three_points_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let (full, _) = program(&base, 3, false);
    assert!(full.error.is_none(), "{:?}", full.error);
    // Just after step 3 (mid-epoch 1), step 6 (mid-epoch 2) and step 8 (the end of epoch 2).
    for at in [3, 6, 8] {
        let dir = tmp.path().join(format!("abort-{at}"));
        let out = run_child(&dir, 3, &[(ABORT_AT, at.to_string())]);
        assert!(
            !out.status.success() && out.status.code().is_none(),
            "the child must die by abort after step {at}: {:?}",
            out.status
        );
        let root = dir.join("ckpt");
        let before = verified_steps(&root);
        eprintln!("abort after step {at}: resuming with checkpoints {before:?}");
        assert!(before.contains(&at), "{before:?}");
        let (resumed, _) = program(&dir, 3, false);
        assert!(
            resumed.error.is_none(),
            "abort at {at}: {:?}",
            resumed.error
        );
        assert_same_records(
            &base.join("ckpt"),
            &root,
            12,
            &format!("after an abort after step {at} (checkpoints then: {before:?})"),
        );
    }
}

/// The CubeCL code path (the one CUDA runs) through wgpu: one abort mid-epoch 2 (after step
/// 6), resumed exactly.
#[cfg(feature = "wgpu")]
#[test]
fn a_real_abort_on_wgpu_resumes_exactly() {
    let wgpu = || Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let (full, _) = program_on(wgpu(), &base, 3, false);
    assert!(full.error.is_none(), "{:?}", full.error);
    let dir = tmp.path().join("abort");
    let out = run_child(&dir, 3, &[(ABORT_AT, "6".into()), (ON_WGPU, "1".into())]);
    assert!(
        out.status.code().is_none(),
        "the child must die by abort: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let root = dir.join("ckpt");
    let before = verified_steps(&root);
    assert!(before.contains(&6), "{before:?}");
    let (resumed, _) = program_on(wgpu(), &dir, 3, false);
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
    assert_same_records(
        &base.join("ckpt"),
        &root,
        12,
        &format!("on wgpu after an abort (checkpoints then: {before:?})"),
    );
}

/// `ZeroTrainingStrategy` with 2 ranks, a shuffled loader and dropout: a real abort just after
/// step 2 (mid-epoch 1), step 6 (mid-epoch 2) and step 8 (the end of epoch 2), each resumed
/// with `.resume_latest()`, ends with the bytes of the uninterrupted run.
#[test]
fn two_zero_ranks_abort_at_three_points_and_resume_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let full = zero_program(&base, 3);
    assert!(full.error.is_none(), "{:?}", full.error);
    assert_eq!(verified_steps(&base.join("ckpt")), vec![2, 4, 6, 8, 10, 12]);
    for at in [2, 6, 8] {
        let dir = tmp.path().join(format!("abort-{at}"));
        let out = run_child(&dir, 3, &[(ABORT_AT, at.to_string()), (ZERO, "1".into())]);
        assert!(
            out.status.code().is_none(),
            "the child must die by abort after step {at}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let root = dir.join("ckpt");
        let before = verified_steps(&root);
        eprintln!("zero: abort after step {at}: resuming with checkpoints {before:?}");
        assert!(before.contains(&at) && !before.contains(&12), "{before:?}");
        let resumed = zero_program(&dir, 3);
        assert!(
            resumed.error.is_none(),
            "abort at {at}: {:?}",
            resumed.error
        );
        assert_same_records(
            &base.join("ckpt"),
            &root,
            12,
            &format!(
                "on 2 ZeRO ranks after an abort after step {at} (checkpoints then: {before:?})"
            ),
        );
    }
}

/// `ZeroTrainingStrategy` with a memory tier (2 ranks as 2 nodes, a memory save every step,
/// disk every 4): a real abort after the tier's step 7 resumes from the tier (newer than the
/// disk's 4), and then from a peer's replica with rank 1's node wiped; both end with the bytes
/// of the uninterrupted run.
#[test]
fn two_zero_ranks_resume_from_the_memory_tier_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let full = zero_program_with(&base, 3, true);
    assert!(full.error.is_none(), "{:?}", full.error);
    assert_eq!(verified_steps(&base.join("ckpt")), vec![4, 8, 12]);
    assert!(
        !base.join("tier/node-0").read_dir().unwrap().any(|_| true),
        "a clean finish removes the tier"
    );
    for wipe in [false, true] {
        let dir = tmp.path().join(format!("memory-wipe-{wipe}"));
        let env = [
            (ABORT_AT, "7".to_string()),
            (ZERO, "1".into()),
            (MEMORY, "1".into()),
        ];
        let out = run_child(&dir, 3, &env);
        assert!(
            out.status.code().is_none(),
            "the child must die by abort after step 7: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!verified_steps(&dir.join("ckpt")).contains(&8));
        if wipe {
            std::fs::remove_dir_all(dir.join("tier/node-1")).unwrap();
        }
        let out = run_child(&dir, 3, &[(ZERO, "1".into()), (MEMORY, "1".into())]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{:?}\n{stderr}", out.status);
        assert!(
            stderr.contains("resumed from the memory tier"),
            "wipe {wipe}: not resumed from the tier:\n{stderr}"
        );
        if wipe {
            assert!(
                stderr.contains("restored from rank 0's replica"),
                "{stderr}"
            );
        }
        assert_same_records(
            &base.join("ckpt"),
            &dir.join("ckpt"),
            12,
            &format!("on 2 ZeRO ranks resumed from the memory tier (node 1 wiped: {wipe})"),
        );
    }
}

/// Recovery runs when the checkpoints are opened, before `launch` installs Burn's logger; the
/// strategy re-emits what it did when training starts, so a quarantined checkpoint is in
/// `experiment.log`.
#[test]
fn what_recovery_did_reaches_burns_experiment_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let (first, _) = program(&dir, 1, false);
    assert!(first.error.is_none(), "{:?}", first.error);
    let root = dir.join("ckpt");
    let newest = *verified_steps(&root).last().unwrap();
    flip_byte(&step_dir(&root, newest).join(MODEL_FILE), At::Middle, 0x40);
    let out = run_child(&dir, 2, &[(LOGGED, "1".into())]);
    assert_exited_ok(&out);
    let log = std::fs::read_to_string(dir.join("burn").join("experiment.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("moved an invalid checkpoint aside"))
        .unwrap_or_else(|| panic!("no recovery warning in experiment.log:\n{log}"));
    assert!(
        line.contains("WARN") && line.contains(&checkpoint_dir_name(newest)),
        "{line}"
    );
    // Each save the resumed run published is a line there too, and so is the summary.
    assert!(
        log.lines()
            .any(|l| l.contains("checkpoint published") && l.contains("stall_ms")),
        "no save in experiment.log:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("checkpoints of this run so far")),
        "no summary in experiment.log:\n{log}"
    );
    // The strategy's saves do not stall: no notice that they do.
    assert!(!log.contains(EPOCH_ROUTE_NOTICE), "{log}");
}

/// The checkpointers alone in Burn's epoch loop stall like Burn's checkpointer (Burn builds the
/// records on its training thread): the first save says so in `experiment.log`, once, and
/// names the way that does not stall.
#[test]
fn the_epoch_route_says_in_burns_log_that_its_saves_stall() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let out = run_child(&dir, 2, &[(EPOCH_ROUTE, "1".into())]);
    assert_exited_ok(&out);
    assert_eq!(verified_steps(&dir.join("ckpt")), vec![1, 2]);
    let log = std::fs::read_to_string(dir.join("burn").join("experiment.log")).unwrap();
    let notices: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(EPOCH_ROUTE_NOTICE))
        .collect();
    assert_eq!(notices.len(), 1, "{log}");
    assert!(
        notices[0].contains("INFO") && notices[0].contains("FrequencyPolicy::Never"),
        "{}",
        notices[0]
    );
}
