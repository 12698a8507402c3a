//! Disk faults reaching the example trainer: injected `ENOSPC` / `EIO` at every step of the
//! publication protocol, a real full filesystem (a small tmpfs), the `--on-save-error` policy,
//! and a persist slower than the save interval (backpressure shown in the report, in-flight
//! checkpoints bounded).

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use burn_ckpt::ckpt_core::{self, failpoints};
use common::*;
use test_support::fs::{At, flip_byte};

#[test]
fn child_entry() {
    common::child_entry();
}

fn errno_text(err: &str) -> &'static str {
    match err {
        "enospc" => "No space left on device (os error 28)",
        _ => "Input/output error (os error 5)",
    }
}

#[test]
fn enospc_and_eio_at_every_protocol_point_stop_the_trainer_naming_the_step() {
    let tmp = tempfile::tempdir().unwrap();
    let save_every = 5;
    for fp in failpoints::ALL {
        for err in ["enospc", "eio"] {
            let dir = tmp.path().join(format!("{}-{err}", fp.replace("::", "_")));
            let out = trainer(&dir)
                .steps(30)
                .save_every(save_every)
                .arg("--keep-last", 1)
                .failpoint(fp, format!("return({err})"))
                .run();
            // Retention first runs when the second checkpoint (step 10) is published.
            let step = if *fp == failpoints::RETENTION { 10 } else { 5 };
            assert_eq!(out.status.code(), Some(1), "{fp} {err}: {}", out.stderr);
            let line = out
                .line("error: ")
                .unwrap_or_else(|| panic!("{fp} {err}: no error line:\n{}", out.stderr));
            assert!(
                line.contains(&format!("checkpoint at step {step} ")),
                "{fp} {err}: the error does not name step {step}: {line}"
            );
            assert!(line.contains(errno_text(err)), "{fp} {err}: {line}");
            // Promptly: at the latest when the next save needs the persist slot.
            let last = out.last_step_line().unwrap_or(0);
            assert!(
                last <= step + save_every,
                "{fp} {err}: trained to step {last} after the failure at {step}"
            );
            // Nothing partial is published, `latest` is valid, no temporary data is left.
            let published = assert_published_valid(&dir);
            assert!(
                tmp_entries(&dir).is_empty(),
                "{fp} {err}: {:?}",
                tmp_entries(&dir)
            );
            if *fp == failpoints::RETENTION {
                // Retention fails after publication: step 10 is there (a save already queued
                // when the error surfaced may have been published after it, too).
                assert!(
                    line.contains("was published, but retention failed"),
                    "{line}"
                );
                assert!(published.contains(&10), "{published:?}");
                assert!(latest_step(&dir) >= Some(10));
            } else {
                assert!(published.is_empty(), "{fp} {err}: published {published:?}");
                assert_eq!(latest_step(&dir), None);
            }
        }
    }
}

#[test]
fn on_save_error_continue_counts_the_failure_and_later_saves_work() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    trainer(&base).steps(30).save_every(5).run_ok();

    let dir = tmp.path().join("run");
    let report = tmp.path().join("report.json");
    let out = trainer(&dir)
        .steps(30)
        .save_every(5)
        .arg("--on-save-error", "continue")
        .arg("--report", report.display())
        .failpoint(failpoints::FSYNC_MANIFEST, "1*return(eio)")
        .run_ok();
    let r = read_report(&report);
    let failed = r["failed_saves"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{r}");
    assert_eq!(failed[0]["step"], 5);
    let msg = failed[0]["error"].as_str().unwrap();
    assert!(
        msg.contains("checkpoint at step 5 ") && msg.contains(errno_text("eio")),
        "{msg}"
    );
    let saved: Vec<u64> = r["saves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_u64().unwrap())
        .collect();
    assert_eq!(saved, [10, 15, 20, 25, 30]);
    assert!(
        out.line("warning: 1 checkpoint(s) failed").is_some(),
        "{}",
        out.stderr
    );
    assert_eq!(assert_published_valid(&dir), [10, 15, 20, 25, 30]);
    assert!(tmp_entries(&dir).is_empty());
    // The failure did not perturb training.
    assert_same_files(&step_dir(&base, 30), &step_dir(&dir, 30));

    // The run's last checkpoint failing is an error even under `continue`.
    let dir = tmp.path().join("last");
    let out = trainer(&dir)
        .steps(12)
        .save_every(5)
        .arg("--on-save-error", "continue")
        .failpoint(failpoints::WRITE_PART, "return(enospc)")
        .run();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let line = out.line("error: ").unwrap();
    assert!(line.contains("checkpoint at step 12 "), "{line}");
    assert_eq!(out.last_step_line(), Some(12));
    assert!(assert_published_valid(&dir).is_empty());
    assert!(tmp_entries(&dir).is_empty());
}

/// A tmpfs mounted on a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if out.status.success() {
            Ok(Self(dir.to_path_buf()))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Bytes in use, as `df` reports them.
    fn used(&self) -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=used"])
            .arg(&self.0)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_filesystem_stops_the_trainer_naming_the_step_and_reclaims_space() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    let fs = Tmpfs::mount(&mnt, "1m");
    let dir = mnt.join("run");
    let mut t = trainer(&dir).steps(400).save_every(5).arg("--hidden", 64);
    match &fs {
        Ok(_) => eprintln!("using a real 1 MiB tmpfs at {}", mnt.display()),
        Err(e) => {
            eprintln!(
                "SKIP real full filesystem: mount -t tmpfs failed ({e}); used the failpoint \
                 {}=20*off->return(enospc) instead (the 6th save runs out of space)",
                failpoints::WRITE_PART
            );
            t = t.failpoint(failpoints::WRITE_PART, "20*off->return(enospc)");
        }
    }
    let out = t.run();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let line = out.line("error: ").unwrap();
    assert!(line.contains(errno_text("enospc")), "{line}");
    let step: u64 = line
        .split("checkpoint at step ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the error names no step: {line}"));
    assert!(step.is_multiple_of(5) && step < 400, "{line}");
    let published = assert_published_valid(&dir);
    assert!(!published.is_empty(), "nothing fit: {line}");
    assert!(
        published.iter().all(|s| *s < step),
        "{published:?} vs {step}"
    );
    assert_eq!(latest_step(&dir), published.last().copied());
    assert!(tmp_entries(&dir).is_empty(), "{:?}", tmp_entries(&dir));
    if let Ok(fs) = &fs {
        // Space is reclaimed: what is in use is the published checkpoints (page-rounded).
        let mut expect = 0u64;
        for s in &published {
            for e in std::fs::read_dir(step_dir(&dir, *s)).unwrap() {
                expect += e.unwrap().metadata().unwrap().len().div_ceil(4096) * 4096;
            }
        }
        for f in [ckpt_core::layout::LATEST_FILE, ckpt_core::layout::LOCK_FILE] {
            expect += std::fs::metadata(dir.join(f)).unwrap().len().div_ceil(4096) * 4096;
        }
        let used = fs.used();
        eprintln!(
            "tmpfs full at step {step}: {} checkpoints published, {used} bytes in use, \
             {expect} bytes in published files",
            published.len()
        );
        assert!(
            used <= expect + 8192,
            "{used} bytes in use, {expect} published"
        );
    }
}

#[test]
fn a_slow_disk_shows_backpressure_in_the_report_and_bounds_in_flight_saves() {
    let tmp = tempfile::tempdir().unwrap();
    // Each save takes at least 4 x 40 ms, far longer than 2 training steps.
    let slow = |name: &str, extra: &[(&str, &str)]| {
        let dir = tmp.path().join(name);
        let report = tmp.path().join(format!("{name}.json"));
        let mut t = trainer(&dir)
            .steps(20)
            .save_every(2)
            .arg("--report", report.display())
            .failpoint(failpoints::FSYNC_PART, "sleep(40)");
        for (k, v) in extra {
            t = t.arg(k, v);
        }
        let out = t.run_ok();
        assert_published_valid(&dir);
        (read_report(&report), out, dir)
    };

    // block (the default): every save is kept, the wait is counted, one in flight at most.
    let (r, out, dir) = slow("block", &[]);
    assert_eq!(r["backpressure"], "block");
    assert_eq!(r["saves"].as_array().unwrap().len(), 10, "{r}");
    assert_eq!(r["skipped"], 0);
    assert!(r["blocked_ms"].as_f64().unwrap() > 500.0, "{r}");
    assert_eq!(r["max_in_flight"], 1);
    assert_eq!(r["max_in_flight_seen"], 1);
    assert!(out.stderr.contains("ms blocked waiting for a persist slot"));
    assert_eq!(assert_published_valid(&dir).len(), 10);

    // skip with two slots: saves are dropped and counted, never more than two in flight,
    // and the last step is still checkpointed.
    let (r, out, dir) = slow(
        "skip",
        &[("--backpressure", "skip"), ("--max-in-flight", "2")],
    );
    assert_eq!(r["backpressure"], "skip");
    let skipped = r["skipped"].as_u64().unwrap();
    let saved = r["saves"].as_array().unwrap();
    assert!(skipped > 0, "{r}");
    assert_eq!(saved.len() as u64 + skipped, 10, "{r}");
    assert_eq!(r["max_in_flight"], 2);
    assert!(r["max_in_flight_seen"].as_u64().unwrap() <= 2, "{r}");
    assert_eq!(saved.last().unwrap()["step"], 20);
    assert!(
        out.stderr.contains("skipped (pipeline full)"),
        "{}",
        out.stderr
    );
    assert_eq!(latest_step(&dir), Some(20));
}

/// The same policies on ZeRO-1 ranks as on one: under `--on-save-error continue` a failed
/// sharded save (ENOSPC at rank 0's manifest fsync) is counted, every rank goes on and later
/// saves publish the bytes of an undisturbed run; the last one failing still stops the run.
/// Under `--snapshot-budget-mb`, saves too big for the budget are written while the ranks
/// wait, with the same bytes, and the trainer says so.
#[test]
fn zero_ranks_follow_on_save_error_and_the_snapshot_budget() {
    let tmp = tempfile::tempdir().unwrap();
    for format in ["consolidated", "per-rank"] {
        let ranks = |t: Trainer| t.arg("--ranks", 2).arg("--shard-format", format);
        let base = tmp.path().join(format!("base-{format}"));
        ranks(trainer(&base).steps(30).save_every(5)).run_ok();

        let dir = tmp.path().join(format!("continue-{format}"));
        let report = tmp.path().join(format!("report-{format}.json"));
        let out = ranks(trainer(&dir).steps(30).save_every(5))
            .arg("--on-save-error", "continue")
            .arg("--report", report.display())
            .failpoint(failpoints::FSYNC_MANIFEST, "1*return(enospc)")
            .run_ok();
        let r = read_report(&report);
        let failed = r["failed_saves"].as_array().unwrap();
        assert_eq!(failed.len(), 1, "{r}");
        assert_eq!(failed[0]["step"], 5);
        let msg = failed[0]["error"].as_str().unwrap();
        assert!(
            msg.contains("checkpoint at step 5 ") && msg.contains(errno_text("enospc")),
            "{msg}"
        );
        assert!(
            out.stderr.contains("checkpoint failed; training continues"),
            "{}",
            out.stderr
        );
        assert_eq!(assert_published_valid(&dir), [10, 15, 20, 25, 30]);
        assert!(tmp_entries(&dir).is_empty(), "{:?}", tmp_entries(&dir));
        assert_same_checkpoint(&step_dir(&base, 30), &step_dir(&dir, 30));

        // The last checkpoint failing stops the run with exit 1 naming the step.
        let last = tmp.path().join(format!("last-{format}"));
        let out = ranks(trainer(&last).steps(12).save_every(5))
            .arg("--on-save-error", "continue")
            .failpoint(failpoints::FSYNC_MANIFEST, "2*off->return(eio)")
            .run();
        assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
        let line = out.line("error: ").unwrap();
        assert!(line.contains("checkpoint at step 12 "), "{line}");
        assert_eq!(assert_published_valid(&last), [5, 10]);

        // A budget below what a background save holds: training waits until it fits, same bytes.
        let big = |t: Trainer| ranks(t).arg("--hidden", 384).steps(10).save_every(5);
        let free = tmp.path().join(format!("free-{format}"));
        big(trainer(&free)).run_ok();
        let tight = tmp.path().join(format!("tight-{format}"));
        let report = tmp.path().join(format!("budget-{format}.json"));
        let out = big(trainer(&tight))
            .arg("--snapshot-budget-mb", 1)
            .arg("--report", report.display())
            .run_ok();
        let r = read_report(&report);
        assert_eq!(r["throttled_saves"], serde_json::json!([5, 10]), "{r}");
        assert!(
            out.stderr.contains("snapshot memory budget"),
            "{}",
            out.stderr
        );
        for st in [5, 10] {
            assert_same_checkpoint(&step_dir(&free, st), &step_dir(&tight, st));
        }
    }
}

/// One flipped byte in the newest checkpoint: `--resume` falls back to the previous one and
/// says so on stderr, naming the skipped checkpoint, the file and the reason, and the step it
/// resumed from.
#[test]
fn resume_past_a_corrupt_newest_checkpoint_says_which_file_and_why() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    trainer(&dir).steps(10).save_every(5).run_ok();
    let optim = step_dir(&dir, 10).join(burn_ckpt::ckpt_burn::OPTIM_FILE);
    flip_byte(&optim, At::Middle, 0x01);

    let out = trainer(&dir)
        .steps(15)
        .save_every(5)
        .flag("--resume")
        .run_ok();
    let skipped = out
        .stderr
        .lines()
        .find(|l| l.contains("step-00000010"))
        .unwrap_or_else(|| panic!("no line names the skipped checkpoint:\n{}", out.stderr));
    assert!(skipped.contains("optim.bpk"), "{skipped}");
    assert!(skipped.contains("checksum"), "{skipped}");
    assert!(out.stderr.contains("resumed from step 5"), "{}", out.stderr);
    assert_eq!(assert_published_valid(&dir), [5, 10, 15]);
}
