//! Preemption: SIGTERM / SIGINT stop the example trainer at a step boundary with a durable final
//! checkpoint, a one-line message and a distinct exit status; `--resume` then reproduces the
//! uninterrupted run byte for byte. A second signal exits at once; `--grace-period` bounds the
//! wait for the final checkpoint.

mod common;

use std::time::{Duration, Instant};

use burn_ckpt::ckpt_core::{self, failpoints};
use common::*;

#[test]
fn child_entry() {
    common::child_entry();
}

const STEPS: u64 = 60;
const LONG: Duration = Duration::from_secs(120);

/// Runs the uninterrupted reference with a checkpoint at every step, so any stop step has a
/// counterpart.
fn baseline(root: &std::path::Path) {
    trainer(root).steps(STEPS).save_every(1).run_ok();
}

/// Sends `signal` mid-run and checks the stop: status 75, the message naming the step, the
/// final checkpoint verified and equal to the reference's, then resume to the end.
fn stop_and_resume(signal: &str, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    baseline(&base);
    let dir = tmp.path().join("run");
    let report = tmp.path().join("report.json");
    // Slow persists (4 parts x 30 ms) with backpressure `block` keep the run going for seconds.
    let mut run = trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .arg("--report", report.display())
        .failpoint(failpoints::WRITE_PART, "sleep(30)")
        .spawn();
    let seen = run.wait_for_step(9, LONG);
    run.signal(signal);
    let out = run.wait(LONG);
    assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{}", out.stderr);
    let line = out
        .line(&format!("stopped by {name} at step "))
        .unwrap_or_else(|| panic!("no stop line:\n{}", out.stderr));
    let k: u64 = line[format!("stopped by {name} at step ").len()..]
        .split(':')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(
        k >= seen && k < STEPS,
        "stopped at {k}, signal after {seen}"
    );
    assert!(line.contains("is durable"), "{line}");
    assert!(line.contains(&ckpt_core::checkpoint_dir_name(k)), "{line}");

    // The stop step's checkpoint is published, verified, named by `latest`, and equals the
    // uninterrupted run's state at that step.
    let steps = assert_published_valid(&dir);
    assert_eq!(steps.last(), Some(&k));
    assert_eq!(latest_step(&dir), Some(k));
    assert!(tmp_entries(&dir).is_empty(), "{:?}", tmp_entries(&dir));
    assert_same_files(&step_dir(&base, k), &step_dir(&dir, k));
    let r = read_report(&report);
    assert_eq!(r["stopped"]["step"], k);
    assert_eq!(r["stopped"]["outcome"], "saved");
    assert_eq!(r["final_step"], k);

    // Resume continues to the end and writes the uninterrupted run's bytes.
    trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .arg("--report", report.display())
        .flag("--resume")
        .run_ok();
    assert_eq!(read_report(&report)["start_step"], k);
    assert_same_files(&step_dir(&base, STEPS), &step_dir(&dir, STEPS));
}

#[test]
fn sigterm_saves_the_stop_step_and_resume_matches_the_uninterrupted_run() {
    stop_and_resume("TERM", "SIGTERM");
}

#[test]
fn sigint_saves_the_stop_step_and_resume_matches_the_uninterrupted_run() {
    stop_and_resume("INT", "SIGINT");
}

#[test]
fn a_second_signal_exits_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // Every publication stalls 8 s at the rename: the final checkpoint cannot be durable soon.
    let mut run = trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .arg("--grace-period", 60)
        .failpoint(failpoints::RENAME, "sleep(8000)")
        .spawn();
    run.wait_for_step(2, LONG);
    run.signal("TERM");
    run.wait_for_line(LONG, |l| l.starts_with("received SIGTERM:"));
    let t0 = Instant::now();
    run.signal("TERM");
    let out = run.wait(LONG);
    let waited = t0.elapsed();
    assert_eq!(out.status.code(), Some(128 + 15), "{}", out.stderr);
    assert!(
        waited < Duration::from_secs(4),
        "the second signal took {waited:?} to end the run"
    );
    assert!(
        out.line("received SIGTERM again: exiting at once")
            .is_some(),
        "{}",
        out.stderr
    );
    // Nothing half-written is published; the next start cleans up and runs to the end.
    assert_published_valid(&dir);
    trainer(&dir)
        .steps(12)
        .save_every(3)
        .flag("--resume")
        .run_ok();
    assert_published_valid(&dir);
    assert!(tmp_entries(&dir).is_empty());
}

#[test]
fn the_grace_period_bounds_the_wait_for_the_final_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    trainer(&base).steps(STEPS).save_every(3).run_ok();
    let dir = tmp.path().join("run");
    let mut run = trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .arg("--grace-period", 1)
        .failpoint(failpoints::RENAME, "sleep(8000)")
        .spawn();
    run.wait_for_step(2, LONG);
    let t0 = Instant::now();
    run.signal("TERM");
    let out = run.wait(LONG);
    let waited = t0.elapsed();
    assert_eq!(
        out.status.code(),
        Some(EXIT_GRACE_EXPIRED),
        "{}",
        out.stderr
    );
    let line = out
        .line("error: stopped by SIGTERM")
        .unwrap_or_else(|| panic!("no grace line:\n{}", out.stderr));
    assert!(line.contains("grace period of 1 s ran out"), "{line}");
    // Within the grace period plus the watchdog's margin, well before the 8 s persist ends.
    assert!(waited < Duration::from_secs(6), "took {waited:?}");
    // What was published is intact, and resume still reproduces the reference.
    assert_published_valid(&dir);
    trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .flag("--resume")
        .run_ok();
    assert_same_files(&step_dir(&base, STEPS), &step_dir(&dir, STEPS));
}
