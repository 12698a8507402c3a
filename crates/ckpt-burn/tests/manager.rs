//! `CheckpointManager`: a loop of one's own with the README's few lines checkpoints on policy,
//! resumes exactly, keeps the newest checkpoints, and never writes into a root of an earlier
//! run it did not resume.

use std::path::Path;

use burn::data::dataloader::batcher::Batcher;
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{AdamWConfig, ModuleOptimizer};
use burn::tensor::Device;
use burn::train::TrainStep;
use ckpt_burn::{CheckpointManager, DataCursor, Error, MODEL_FILE, ManagerConfig, OPTIM_FILE};
use ckpt_core::layout::checkpoint_dir_name;
use test_support::fs::verified_steps;
use test_support::tiny::{Tiny, TinyBatcher, data};

/// The training state of a loop of one's own.
struct State {
    device: Device,
    model: Tiny,
    optim: ModuleOptimizer,
    sched: ModuleLrScheduler,
}

impl State {
    fn new(model: &Tiny, device: &Device) -> Self {
        Self {
            device: device.clone(),
            model: model.clone(),
            optim: AdamWConfig::new().init(),
            sched: CosineAnnealingLrSchedulerConfig::new(1e-2, 100)
                .init()
                .unwrap(),
        }
    }

    /// Step `step`: a fixed batch of 16 samples chosen by the step (no randomness).
    fn train(&mut self, step: u64) {
        let items = data();
        let at = (step as usize * 16) % items.len();
        let batch = TinyBatcher.batch(items[at..at + 16].to_vec(), &self.device);
        let out = TrainStep::step(&self.model, batch);
        let grads = out.grads;
        let lr = self.sched.step();
        self.model = self.optim.step(lr, self.model.clone(), grads);
    }
}

/// A loop of one's own with the README's lines, up to `steps`.
fn run(init: &Tiny, config: ManagerConfig, steps: u64) -> Result<(), Error> {
    let device = Device::flex().autodiff();
    let mut st = State::new(init, &device);
    // The lines a user writes:
    let mut ckpt = CheckpointManager::open(config)?;
    let start = ckpt
        .resume(&mut st.model, &mut st.optim, &mut st.sched)?
        .map_or(0, |t| t.step);
    for step in start + 1..=steps {
        st.train(step);
        if ckpt.step(step, &st.model, &st.optim, &st.sched, DataCursor::default())? {
            break;
        }
    }
    ckpt.finish()?;
    Ok(())
}

fn file(root: &Path, step: u64, name: &str) -> Vec<u8> {
    std::fs::read(root.join(checkpoint_dir_name(step)).join(name)).unwrap()
}

#[test]
fn a_custom_loop_checkpoints_on_policy_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let init = Tiny::seeded(&device, 3);

    let full = tmp.path().join("full");
    let cfg = |root: &Path, end| {
        ManagerConfig::new(root)
            .every_steps(3)
            .end_step(end)
            .keep_last(None)
    };
    run(&init, cfg(&full, 8), 8).unwrap();
    // Every 3 steps, and the last one.
    assert_eq!(verified_steps(&full), vec![3, 6, 8]);

    // A run that stopped at step 5, resumed to 8: the same files as the uninterrupted run.
    let cut = tmp.path().join("cut");
    run(&init, cfg(&cut, 5), 5).unwrap();
    assert_eq!(verified_steps(&cut), vec![3, 5]);
    run(&init, cfg(&cut, 8), 8).unwrap();
    assert!(
        verified_steps(&cut).ends_with(&[8]),
        "{:?}",
        verified_steps(&cut)
    );
    for name in [MODEL_FILE, OPTIM_FILE] {
        assert!(
            file(&full, 8, name) == file(&cut, 8, name),
            "{name} of the resumed run differs"
        );
    }

    // The optimizer's record went through a scratch file (in RAM, or in the root): none is
    // left in the root.
    let left: Vec<String> = std::fs::read_dir(&full)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(left.is_empty(), "scratch files left in the root: {left:?}");

    // By default the newest 3 are kept.
    let kept = tmp.path().join("kept");
    run(
        &init,
        ManagerConfig::new(&kept).every_steps(1).end_step(6),
        6,
    )
    .unwrap();
    assert_eq!(verified_steps(&kept), vec![4, 5, 6]);
}

/// A scratch file in `/dev/shm` named as one of this pid namespace's processes that cannot
/// exist (a pid above `pid_max`) would leave it after a crash; `None` where `/dev/shm` takes
/// no scratch files (not a tmpfs, or without 512 MiB free).
fn dead_process_scratch_in_ram() -> Option<std::path::PathBuf> {
    let ram = Path::new("/dev/shm");
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a writable statfs the call fills.
    if unsafe { libc::statfs(c"/dev/shm".as_ptr(), &mut st) } != 0
        || st.f_type as i64 != 0x0102_1994
        || (st.f_bavail as u64).saturating_mul(st.f_bsize as u64) < 512 << 20
    {
        return None;
    }
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let ns: String = ns
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let path = ram.join(format!(
        "burn-ckpt-{ns}-{}-optim-00000002-0.bpk",
        pid_max + 1
    ));
    std::fs::write(&path, b"half a record").ok()?;
    Some(path)
}

#[test]
fn a_used_root_is_refused_unless_resumed_or_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let init = Tiny::seeded(&device, 4);
    let root = tmp.path().join("ckpt");
    let cfg = || ManagerConfig::new(&root).every_steps(2).end_step(4);
    // A scratch file a crash left behind is removed when the root is opened; one a dead
    // process left in RAM (`/dev/shm`, where it is a tmpfs), at the next save through RAM.
    std::fs::create_dir_all(&root).unwrap();
    let stale = root.join(".tmp-optim-00000002-1-0.bpk");
    std::fs::write(&stale, b"half a record").unwrap();
    let stale_in_ram = dead_process_scratch_in_ram();
    run(&init, cfg(), 4).unwrap();
    assert!(!stale.exists(), "a stale scratch file survived the open");
    if let Some(path) = stale_in_ram {
        assert!(
            !path.exists(),
            "a dead process's scratch file in RAM survived a save"
        );
    }
    let before = verified_steps(&root);
    assert_eq!(before, vec![2, 4]);

    // A fresh loop (no resume) in that root: refused at its first save, nothing replaced.
    let mut st = State::new(&init, &device);
    let mut ckpt = CheckpointManager::open(cfg()).unwrap();
    st.train(1);
    let err = ckpt
        .step(1, &st.model, &st.optim, &st.sched, DataCursor::default())
        .unwrap_err();
    assert!(matches!(err, Error::UsedRoot { newest: 4, .. }), "{err}");
    drop(ckpt);
    assert_eq!(verified_steps(&root), before);

    // Overwrite: the old run's checkpoints are moved aside, the new run saves.
    run(&init, cfg().overwrite(true).end_step(2), 2).unwrap();
    assert_eq!(verified_steps(&root), vec![2]);
    assert!(
        std::fs::read_dir(&root).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".rewound-")),
        "the old checkpoints were not kept aside"
    );
}

#[test]
fn a_stop_request_checkpoints_that_step_and_ends_the_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let init = Tiny::seeded(&device, 5);
    let root = tmp.path().join("ckpt");
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut st = State::new(&init, &device);
    let mut ckpt = CheckpointManager::open(
        ManagerConfig::new(&root)
            .every_steps(100)
            .stop_on(flag.clone(), Some(std::time::Duration::from_secs(60))),
    )
    .unwrap();
    let mut stopped_at = None;
    for step in 1..=20 {
        st.train(step);
        if step == 4 {
            // A signal handler or a batch system's notice, between two steps.
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if ckpt
            .step(step, &st.model, &st.optim, &st.sched, DataCursor::default())
            .unwrap()
        {
            stopped_at = Some(step);
            break;
        }
    }
    assert_eq!(stopped_at, Some(4));
    assert_eq!(ckpt.last_saved(), Some(4));
    let report = ckpt.finish().unwrap();
    let stop = report.session.stopped.expect("the stop is reported");
    assert_eq!(stop.step, 4);
    assert_eq!(verified_steps(&root), vec![4]);
}

#[test]
fn a_background_save_writes_the_bytes_of_a_blocking_one() {
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let init = Tiny::seeded(&device, 6);
    let cfg = |name: &str| {
        ManagerConfig::new(tmp.path().join(name))
            .every_steps(2)
            .end_step(6)
    };
    run(&init, cfg("background"), 6).unwrap();
    run(&init, cfg("blocking").blocking(true), 6).unwrap();
    for step in [4, 6] {
        for name in [MODEL_FILE, OPTIM_FILE] {
            assert!(
                file(&tmp.path().join("background"), step, name)
                    == file(&tmp.path().join("blocking"), step, name),
                "{name} of step {step} differs between a background and a blocking save"
            );
        }
    }
}

#[test]
fn the_first_step_counts_its_real_time_in_the_baseline() {
    // The step time fed to the frequency controller is measured between `step` calls; the
    // first call has none before it. Counting it as 0 s put a zero into the baseline (the lower
    // quartile of clean steps), so every save's lost time looked larger than it was.
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let init = Tiny::seeded(&device, 9);
    let mut st = State::new(&init, &device);
    let mut ckpt = CheckpointManager::open(
        ManagerConfig::new(tmp.path().join("ckpt"))
            .every_steps(100)
            .end_step(3),
    )
    .unwrap();
    for step in 1..=3 {
        st.train(step);
        std::thread::sleep(std::time::Duration::from_millis(30));
        ckpt.step(step, &st.model, &st.optim, &st.sched, DataCursor::default())
            .unwrap();
    }
    let report = ckpt.finish().unwrap();
    let baseline = report.session.lost.baseline_step_ms.expect("a baseline");
    assert!(
        baseline >= 25.0,
        "baseline step time {baseline} ms, but every step took at least 30 ms"
    );
}

#[test]
fn the_end_step_ends_the_loop_after_checkpointing_it() {
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let init = Tiny::seeded(&device, 3);
    let root = tmp.path().join("run");
    // A loop that would go on to step 10, told the run ends at step 4: `step` returns `true`
    // there, after step 4 is saved, so steps 6 and 9 never come.
    let cfg = ManagerConfig::new(&root)
        .every_steps(3)
        .end_step(4)
        .keep_last(None);
    run(&init, cfg, 10).unwrap();
    assert_eq!(verified_steps(&root), vec![3, 4]);
}
