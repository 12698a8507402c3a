//! Concurrent writers: a second trainer on a root in use is refused with a message naming the
//! lock and its holder; the lock of a trainer killed with SIGKILL is recovered, and resume
//! reproduces the uninterrupted run.

mod common;

use std::time::Duration;

use burn_ckpt::ckpt_core::{self, failpoints};
use common::*;

#[test]
fn child_entry() {
    common::child_entry();
}

const STEPS: u64 = 60;
const LONG: Duration = Duration::from_secs(120);

#[test]
fn a_second_trainer_on_the_same_root_is_refused_naming_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut first = trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .failpoint(failpoints::WRITE_PART, "sleep(30)")
        .spawn();
    first.wait_for_step(3, LONG);
    let second = trainer(&dir).steps(STEPS).save_every(3).run();
    assert_eq!(second.status.code(), Some(1), "{}", second.stderr);
    let line = second.line("error: ").unwrap();
    assert!(line.contains("is locked by another writer"), "{line}");
    assert!(
        line.contains(&format!("held by pid {} on ", first.pid())),
        "{line}"
    );
    assert!(line.contains(&dir.display().to_string()), "{line}");
    assert!(second.elapsed < Duration::from_secs(30));
    // The first trainer was not disturbed.
    let out = first.wait(LONG);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(latest_step(&dir), Some(STEPS));
    assert_published_valid(&dir);
}

#[test]
fn the_lock_of_a_sigkilled_trainer_is_recovered_and_resume_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    trainer(&base).steps(STEPS).save_every(3).run_ok();
    let dir = tmp.path().join("run");
    let mut first = trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .failpoint(failpoints::WRITE_PART, "sleep(30)")
        .spawn();
    first.wait_for_step(12, LONG);
    let pid = first.pid();
    first.child.kill().unwrap(); // SIGKILL
    let out = first.wait(LONG);
    assert!(!out.status.success());
    // The lock file still names the dead holder; the kernel released the lock itself.
    let holder = std::fs::read_to_string(dir.join(ckpt_core::layout::LOCK_FILE)).unwrap();
    assert!(holder.starts_with(&format!("pid {pid} ")), "{holder}");
    assert_published_valid(&dir);
    let report = tmp.path().join("report.json");
    trainer(&dir)
        .steps(STEPS)
        .save_every(3)
        .flag("--resume")
        .arg("--report", report.display())
        .run_ok();
    let r = read_report(&report);
    assert!(r["start_step"].as_u64().unwrap() >= 9, "{r}");
    assert_same_files(&step_dir(&base, STEPS), &step_dir(&dir, STEPS));
    assert!(tmp_entries(&dir).is_empty());
}
