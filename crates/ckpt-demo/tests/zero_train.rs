//! ZeRO-1 training and sharded checkpoints end to end, on rank threads: N ranks write the same
//! bytes as one, per-rank checkpoints reshard on load (4 to 2 and 1, 2 to 4) and continue to the
//! same bytes, and checkpoint traffic runs beside training traffic.

mod common;

use std::path::Path;

use ckpt_burn::{MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE};
use ckpt_demo::zero::{ZeroConfig, run_threads};
use ckpt_demo::{self as demo, Frequency};
use ckpt_zero::ShardFormat;
use ckpt_zero::shards::shard_file_name;
use test_support::fs::step_dir;

fn cfg(dir: &Path, ranks: usize, steps: u64) -> ZeroConfig {
    let mut z = common::small(dir, ranks, steps, std::time::Duration::from_secs(30));
    z.demo.dropout = 0.2;
    z.demo.seed = 11;
    z
}

/// The plain trainer seeds Burn's process-global RNG without the rank lock `run_threads`
/// uses, so these tests must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn read(dir: &Path, f: &str) -> Vec<u8> {
    std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(f).display()))
}

fn assert_same(a: &Path, b: &Path, files: &[&str]) {
    for f in files {
        assert!(
            read(a, f) == read(b, f),
            "{f} differs: {} vs {}",
            a.display(),
            b.display()
        );
    }
}

const ALL: [&str; 4] = [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE];

#[test]
fn two_and_four_ranks_write_the_bytes_of_one_rank() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut roots = Vec::new();
    for ranks in [1, 2, 4] {
        let root = tmp.path().join(format!("r{ranks}"));
        let report = run_threads(&cfg(&root, ranks, 12), &mut |_| {}).unwrap();
        assert_eq!(report.saves.len(), 3, "ranks {ranks}");
        roots.push(root);
    }
    // The plain single-device trainer, for reference: ZeRO on one rank changes nothing.
    let plain = tmp.path().join("plain");
    let mut d = cfg(&plain, 1, 12).demo;
    d.dir = plain.clone();
    demo::run(&d, &mut |_| {}).unwrap();
    assert_ne!(
        read(&step_dir(&roots[0], 4), MODEL_FILE),
        read(&step_dir(&roots[0], 12), MODEL_FILE)
    );
    for step in [4, 8, 12] {
        for r in &roots[1..] {
            assert_same(&step_dir(&roots[0], step), &step_dir(r, step), &ALL);
        }
        assert_same(&step_dir(&roots[0], step), &step_dir(&plain, step), &ALL);
        let m = ckpt_core::verify_checkpoint(&step_dir(&roots[2], step)).unwrap();
        assert_eq!((m.world_size, m.layout.as_str()), (4, "consolidated"));
    }
}

/// Under an overhead budget rank 0's controller picks the steps and every rank saves at them:
/// the checkpoints, at whatever steps were chosen, hold the bytes one rank writes there.
#[test]
fn an_overhead_budget_on_two_ranks_saves_agreed_steps_with_the_bytes_of_one_rank() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let steps = 60;
    let every = tmp.path().join("every");
    let mut c = cfg(&every, 1, steps);
    c.demo.frequency = Frequency::EverySteps(1);
    run_threads(&c, &mut |_| {}).unwrap();

    let root = tmp.path().join("budget");
    let mut c = cfg(&root, 2, steps);
    c.demo.frequency = Frequency::OverheadBudget(0.9);
    let report = run_threads(&c, &mut |_| {}).unwrap();
    let saved: Vec<u64> = report.saves.iter().map(|s| s.step).collect();
    // At least the measuring save after the warm-up (by step 50 at the latest) and the last.
    assert!(saved.len() >= 2, "saves at {saved:?}");
    assert_eq!(saved.last(), Some(&steps));
    for &st in &saved {
        let m = ckpt_core::verify_checkpoint(&step_dir(&root, st)).unwrap();
        assert_eq!(m.world_size, 2);
        assert_same(&step_dir(&every, st), &step_dir(&root, st), &ALL);
    }
    // Nothing was published at any other step.
    let dirs = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("step-"))
        .count();
    assert_eq!(dirs, saved.len());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &p);
        } else {
            std::fs::copy(e.path(), p).unwrap();
        }
    }
}

#[test]
fn per_rank_checkpoints_reshard_on_load() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    // Reference: one rank, consolidated, uninterrupted to 16.
    let base = tmp.path().join("base");
    run_threads(&cfg(&base, 1, 16), &mut |_| {}).unwrap();

    for (from, tos) in [(4usize, vec![2usize, 1]), (2, vec![4])] {
        let src = tmp.path().join(format!("per-rank-{from}"));
        let mut c = cfg(&src, from, 8);
        c.shard_format = ShardFormat::PerRank;
        run_threads(&c, &mut |_| {}).unwrap();
        let dir = step_dir(&src, 8);
        let m = ckpt_core::verify_checkpoint(&dir).unwrap();
        assert_eq!(
            (m.world_size as usize, m.layout.as_str()),
            (from, "per-rank")
        );
        assert!(m.file(OPTIM_FILE).is_none());
        for r in 0..from {
            assert!(
                m.file(&shard_file_name(r, from)).is_some(),
                "rank {r}'s shard"
            );
        }
        // No staged shard is left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&src)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // The merged shards are the consolidated record of the same step.
        assert_eq!(
            ckpt_zero::shards::read_full_optimizer(&dir).unwrap(),
            read(&step_dir(&base, 8), OPTIM_FILE)
        );

        for to in tos {
            let root = tmp.path().join(format!("{from}-to-{to}"));
            copy_dir(&src, &root);
            let mut c = cfg(&root, to, 16);
            c.demo.resume = true;
            let report = run_threads(&c, &mut |_| {}).unwrap();
            assert_eq!(report.start_step, 8, "{from} -> {to}");
            for step in [12, 16] {
                assert_same(&step_dir(&base, step), &step_dir(&root, step), &ALL);
            }
        }
    }
}

#[test]
fn bad_configurations_are_refused() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut c = cfg(tmp.path(), 0, 4);
    assert!(
        run_threads(&c, &mut |_| {})
            .unwrap_err()
            .to_string()
            .contains("--ranks")
    );
    c.ranks = 2;
    c.demo.frequency = Frequency::OverheadBudget(1.5);
    assert!(
        run_threads(&c, &mut |_| {})
            .unwrap_err()
            .to_string()
            .contains("overhead")
    );
}
