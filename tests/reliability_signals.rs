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
    assert!(
        line.contains(&ckpt_core::layout::checkpoint_dir_name(k)),
        "{line}"
    );

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

/// SIGTERM (or, under `mpirun`, SIGUSR1) to a ZeRO-1 run of `ranks` ranks in `format`: every
/// rank stops at the same step boundary (the ranks agree on it over the training group), the
/// final checkpoint is durable before exit 75 and verifies (per rank: every rank's shard of
/// that step is in it), within the grace period; `--resume` to the end writes the bytes of the
/// uninterrupted run. `mpi` runs the ranks as processes under `mpirun -n ranks`.
fn ranks_stop_and_resume(ranks: usize, format: &str, mpi: bool) {
    ranks_stop_and_resume_by(ranks, format, mpi, false)
}

/// As [`ranks_stop_and_resume`]; with `to_ranks` (under `mpirun` only) SIGTERM goes to every
/// rank process itself, as a batch system that signals all processes of a job step does.
fn ranks_stop_and_resume_by(ranks: usize, format: &str, mpi: bool, to_ranks: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let with = |t: Trainer| {
        let t = t.arg("--shard-format", format).arg("--grace-period", 30);
        if mpi {
            t.arg("--dist", "mpi")
        } else {
            t.arg("--ranks", ranks)
        }
    };
    let launch = |t: Trainer| -> Option<Running> {
        if mpi {
            Some(spawn_command(t.mpirun_command(ranks)?))
        } else {
            Some(t.spawn())
        }
    };
    let finish = |t: Trainer| {
        let run = launch(t).expect("launch");
        let out = run.wait(LONG);
        assert!(out.status.success(), "{}", out.stderr);
    };
    let base = tmp.path().join("base");
    if mpi && trainer(&base).mpirun_command(ranks).is_none() {
        eprintln!("SKIP: mpirun not found (install openmpi-bin)");
        return;
    }
    finish(with(trainer(&base).steps(STEPS).save_every(1)));

    let dir = tmp.path().join("run");
    let mut run = launch(
        with(trainer(&dir).steps(STEPS).save_every(3))
            .failpoint(failpoints::WRITE_PART, "sleep(30)"),
    )
    .expect("launch");
    let seen = run.wait_for_step(9, LONG);
    if to_ranks {
        run.signal_children("TERM");
    } else {
        run.signal(if mpi { "USR1" } else { "TERM" });
    }
    let t0 = Instant::now();
    let out = run.wait(LONG);
    let took = t0.elapsed();
    let name = if mpi && !to_ranks {
        "SIGUSR1"
    } else {
        "SIGTERM"
    };
    assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{}", out.stderr);
    assert!(took < Duration::from_secs(30), "stopping took {took:?}");
    // Under mpirun, rank 0 may stop on another rank's signal before its own arrives.
    let line = out
        .line("stopped by ")
        .unwrap_or_else(|| panic!("no stop line:\n{}", out.stderr));
    assert!(
        mpi || line.starts_with(&format!("stopped by {name} ")),
        "{line}"
    );
    let (_, at) = line
        .split_once(" at step ")
        .expect("the stop line names the step");
    let k: u64 = at.split(':').next().and_then(|s| s.parse().ok()).unwrap();
    assert!(
        k >= seen && k < STEPS,
        "stopped at {k}, signal after {seen}"
    );
    assert!(line.contains("is durable"), "{line}");
    let steps = assert_published_valid(&dir);
    assert_eq!(steps.last(), Some(&k), "{}", out.stderr);
    assert_eq!(latest_step(&dir), Some(k));
    assert!(tmp_entries(&dir).is_empty(), "{:?}", tmp_entries(&dir));
    assert_same_checkpoint(&step_dir(&base, k), &step_dir(&dir, k));

    finish(with(trainer(&dir).steps(STEPS).save_every(3)).flag("--resume"));
    assert_same_checkpoint(&step_dir(&base, STEPS), &step_dir(&dir, STEPS));
}

#[test]
fn sigterm_on_two_rank_threads_stops_all_ranks_at_one_step() {
    ranks_stop_and_resume(2, "consolidated", false);
    ranks_stop_and_resume(2, "per-rank", false);
}

#[test]
fn sigterm_on_four_rank_threads_stops_all_ranks_at_one_step() {
    ranks_stop_and_resume(4, "consolidated", false);
    ranks_stop_and_resume(4, "per-rank", false);
}

/// Under `mpirun -n 4 --dist mpi`: SIGUSR1 to `mpirun` (which forwards it to every rank; a
/// SIGTERM to `mpirun` makes it kill the ranks after a second, see the README).
#[cfg(feature = "mpi")]
#[test]
fn sigusr1_to_mpirun_with_four_ranks_stops_all_ranks_at_one_step() {
    ranks_stop_and_resume(4, "consolidated", true);
    ranks_stop_and_resume(4, "per-rank", true);
}

/// Under `mpirun -n 4 --dist mpi`: SIGTERM to every rank (not to `mpirun`), as Slurm's
/// preemption does: every rank exits 75, and so does `mpirun`.
#[cfg(feature = "mpi")]
#[test]
fn sigterm_to_every_mpi_rank_stops_all_ranks_at_one_step() {
    ranks_stop_and_resume_by(4, "consolidated", true, true);
    ranks_stop_and_resume_by(4, "per-rank", true, true);
}
