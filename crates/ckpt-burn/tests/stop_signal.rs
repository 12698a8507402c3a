//! A loop of one's own stopped by a real SIGTERM: `StopOnSignal::install_flag` sets the flag
//! given to `ManagerConfig::stop_on`, so the next `step` saves that step and ends the loop.
//! Dropping the handler gives SIGTERM back its default effect. (Its own test binary: the
//! signal goes to the whole process.)

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::data::dataloader::batcher::Batcher;
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::{AdamWConfig, ModuleOptimizer};
use burn::tensor::Device;
use burn::train::TrainStep;
use ckpt_burn::stop::StopOnSignal;
use ckpt_burn::{CheckpointManager, DataCursor, ManagerConfig};
use test_support::fs::verified_steps;
use test_support::tiny::{Tiny, TinyBatcher, data};

#[test]
fn sigterm_stops_a_custom_loop_at_a_checkpointed_step() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let device = Device::flex().autodiff();
    let mut model = Tiny::seeded(&device, 7);
    let mut optim: ModuleOptimizer = AdamWConfig::new().init();
    let mut sched = CosineAnnealingLrSchedulerConfig::new(1e-2, 100)
        .init()
        .unwrap();

    let flag = Arc::new(AtomicBool::new(false));
    let signals = StopOnSignal::install_flag(flag.clone()).unwrap();
    let mut ckpt = CheckpointManager::open(
        ManagerConfig::new(&root)
            .every_steps(100)
            .stop_on(flag.clone(), Some(Duration::from_secs(60))),
    )
    .unwrap();
    let items = data();
    let mut stopped_at = None;
    for step in 1..=50u64 {
        let at = (step as usize * 16) % items.len();
        let batch = TinyBatcher.batch(items[at..at + 16].to_vec(), &device);
        let grads = TrainStep::step(&model, batch).grads;
        model = optim.step(sched.step(), model, grads);
        if step == 3 {
            signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
            // The handler thread sets the flag; the run goes on until it has.
            let t = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "SIGTERM did not set the flag"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if ckpt
            .step(step, &model, &optim, &sched, DataCursor::default())
            .unwrap()
        {
            stopped_at = Some(step);
            break;
        }
    }
    assert_eq!(
        stopped_at,
        Some(3),
        "the loop did not stop at the signalled step"
    );
    assert_eq!(signals.received(), Some(signal_hook::consts::SIGTERM));
    let report = ckpt.finish().unwrap();
    assert_eq!(report.session.stopped.map(|s| s.step), Some(3));
    assert_eq!(verified_steps(&root), vec![3]);
}

/// The child side of `a_dropped_handler_leaves_sigterm_its_default_effect`: a no-op unless
/// that test runs it.
#[test]
fn child_drops_the_handler_then_gets_sigterm() {
    if std::env::var_os("CKPT_STOP_SIGNAL_CHILD").is_none() {
        return;
    }
    let flag = Arc::new(AtomicBool::new(false));
    drop(StopOnSignal::install_flag(flag).unwrap());
    signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // Still here: the signal was ignored.
    std::process::exit(0);
}

#[test]
fn a_dropped_handler_leaves_sigterm_its_default_effect() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_drops_the_handler_then_gets_sigterm",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CKPT_STOP_SIGNAL_CHILD", "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(signal_hook::consts::SIGTERM),
        "after the handler was dropped, SIGTERM did not end the process: {out:?}"
    );
}
