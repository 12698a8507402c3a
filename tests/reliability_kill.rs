//! Kill matrix (single rank, and 4 ZeRO-1 ranks): the example trainer is SIGKILLed at random times, with small
//! failpoint sleeps at a random publication-protocol step so kills land inside part writes,
//! fsyncs, the rename, the `latest` update and retention. After every kill, before any
//! recovery, every published checkpoint must verify and `latest` must name one of them (it may
//! only be missing after a crash between the very first checkpoint's rename and the first
//! `latest` write); a resume to the end must then succeed, leave a root that passes
//! `ckpt_core::verify_root`, and write the uninterrupted run's bytes.
//!
//! Kills are chained: the next attempt resumes the killed root (so kills also land in
//! start-up recovery and in resumed runs); the resume-to-the-end check runs on a copy. A chain
//! ends after three kills, or when a run finishes before its kill (its files are then checked
//! against the uninterrupted run's too).
//!
//! `BURN_CKPT_KILL_POINTS=N` (default 30) sets how many kills must land;
//! `BURN_CKPT_KILL_SEED=S` replays a sequence (each kill's parameters are printed).

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use burn_ckpt::ckpt_core::{self, failpoints};
use common::*;

#[test]
fn child_entry() {
    common::child_entry();
}

const STEPS: u64 = 24;
const SAVE_EVERY: u64 = 3;
const KEEP_LAST: u64 = 2;
/// Kills in a row on one root before a fresh root is started.
const MAX_CHAIN: usize = 3;

/// The trainer to kill: one rank, or (`ranks` > 1) ZeRO-1 rank threads with replicated data
/// and consolidated shards, whose bytes must equal the single rank's.
fn run_to(dir: &Path, ranks: usize) -> Trainer {
    let t = trainer(dir)
        .steps(STEPS)
        .save_every(SAVE_EVERY)
        .arg("--keep-last", KEEP_LAST);
    if ranks > 1 {
        t.arg("--ranks", ranks).flag("--replicate-data")
    } else {
        t
    }
}

/// The entries of a root and what `latest` says, to tell whether a killed run changed it.
fn disk_state(root: &Path) -> (Vec<String>, Option<String>) {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != ckpt_core::layout::LOCK_FILE)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    (names, ckpt_core::read_latest(root).ok().flatten())
}

/// Where the protocol was when the kill landed, read from what it left on disk (before any
/// recovery touches the root); `before` is the root's state when the run started.
fn phase(root: &Path, before: &(Vec<String>, Option<String>)) -> &'static str {
    let now = disk_state(root);
    if &now == before {
        return if now.0.is_empty() {
            "start-up or training, nothing written yet"
        } else {
            "start-up or training, root unchanged"
        };
    }
    let names = now.0;
    if names.iter().any(|n| n.starts_with(".tmp-del-")) {
        return "retention (old checkpoint being removed)";
    }
    if names.iter().any(|n| n.starts_with(".tmp-latest-")) {
        return "updating latest";
    }
    if let Some(t) = names.iter().find(|n| {
        n.strip_prefix(".tmp-")
            .and_then(|r| r.chars().next())
            .is_some_and(|c| c.is_ascii_digit())
    }) {
        let tmp = root.join(t);
        if tmp.join(ckpt_core::layout::MANIFEST_FILE).exists() {
            return "manifest written, before the rename";
        }
        let parts = std::fs::read_dir(&tmp).map(|rd| rd.count()).unwrap_or(0);
        return if parts == 0 {
            "temporary directory created, no part yet"
        } else {
            "writing or syncing parts"
        };
    }
    let newest = names
        .iter()
        .filter_map(|n| ckpt_core::layout::parse_step_dir(n))
        .max();
    let latest = ckpt_core::read_latest(root)
        .ok()
        .flatten()
        .and_then(|n| ckpt_core::layout::parse_step_dir(&n));
    if newest.is_some() && newest > latest {
        return "renamed, before latest moved";
    }
    let steps = |v: &[String]| -> Vec<u64> {
        v.iter()
            .filter_map(|n| ckpt_core::layout::parse_step_dir(n))
            .collect()
    };
    let published = steps(&names);
    if published.len() as u64 > KEEP_LAST && published != steps(&before.0) {
        return "retention (latest moved, old checkpoint not yet removed)";
    }
    "no save in flight (training or between saves)"
}

#[test]
fn kill_matrix_sigkill_at_random_points_recovers_and_resumes_exactly() {
    kill_matrix(1);
}

/// The same with 4 ZeRO-1 ranks (threads of the killed process), whose final files must equal
/// the uninterrupted single-rank run's.
#[test]
fn kill_matrix_with_four_zero_ranks() {
    kill_matrix(4);
}

fn kill_matrix(ranks: usize) {
    let points: usize = std::env::var("BURN_CKPT_KILL_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("BURN_CKPT_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6b69_6c6c);
    eprintln!(
        "kill matrix ({ranks} rank(s)): {points} kill points, seed {seed} \
         (BURN_CKPT_KILL_SEED to replay)"
    );
    let t_all = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    // The reference is always the single-rank run: N ZeRO ranks must write its bytes.
    let b = run_to(&base, 1).run_ok();
    assert_eq!(latest_step(&base), Some(STEPS));
    // Calibrate the kill window on a run with persists slowed like the ones below.
    let cal = run_to(&tmp.path().join("calibrate"), ranks)
        .failpoint(failpoints::FSYNC_PART, "sleep(10)")
        .run_ok();
    // A resume with nothing left to do: the cost of starting a trainer.
    let idle = run_to(&base, ranks).flag("--resume").run_ok();
    let startup_ms = idle.elapsed.as_millis() as u64;
    let full_ms = (cal.elapsed.as_millis() as u64).max(startup_ms + 50);
    eprintln!(
        "uninterrupted run {:?}, slowed run {:?}, start-up {:?}: kill delays uniform in \
         {}..{full_ms} ms",
        b.elapsed,
        cal.elapsed,
        idle.elapsed,
        startup_ms / 2
    );

    let mut rng = SplitMix(seed);
    let mut phases: BTreeMap<&'static str, usize> = BTreeMap::new();
    let (mut landed, mut attempts, mut chain, mut in_chain) = (0usize, 0usize, 0usize, 0usize);
    let mut root = tmp.path().join("chain-0");
    while landed < points {
        attempts += 1;
        assert!(
            attempts <= points * 10,
            "only {landed} of {attempts} kills landed"
        );
        let fp = failpoints::ALL[rng.below(failpoints::ALL.len() as u64) as usize];
        let sleep_ms = 1 + rng.below(25);
        if in_chain == MAX_CHAIN {
            chain += 1;
            in_chain = 0;
            root = tmp.path().join(format!("chain-{chain}"));
        }
        // Mostly after the first half of start-up: the rest of the window is training and
        // persists, where the protocol phases are.
        let delay_ms = startup_ms / 2 + rng.below(full_ms - startup_ms / 2);
        let before = disk_state(&root);
        let mut child = run_to(&root, ranks)
            .flag("--resume")
            .failpoint(fp, format!("sleep({sleep_ms})"))
            .command()
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let finished = child.try_wait().unwrap().is_some();
        if !finished {
            child.kill().unwrap(); // SIGKILL
        }
        let st = child.wait().unwrap();
        if finished {
            // The run ended before the kill: the chain is complete; start a fresh root.
            assert!(st.success(), "attempt {attempts}: the trainer failed: {st}");
            assert_same_files(&step_dir(&base, STEPS), &step_dir(&root, STEPS));
            chain += 1;
            in_chain = 0;
            root = tmp.path().join(format!("chain-{chain}"));
            continue;
        }
        landed += 1;
        in_chain += 1;
        // What any reader may rely on right after the crash, before recovery.
        let (_, first_window) = assert_crash_consistent(&root);
        let ph = if first_window {
            "first checkpoint renamed, first `latest` not yet written"
        } else {
            phase(&root, &before)
        };
        *phases.entry(ph).or_default() += 1;
        eprintln!(
            "kill {landed}: chain {chain} #{in_chain}, failpoint {fp}=sleep({sleep_ms}), \
             SIGKILL after {delay_ms} ms -> {ph}"
        );

        // Resume to the end (on a copy, so the chain continues from the crash state).
        let check = tmp.path().join("check");
        let _ = std::fs::remove_dir_all(&check);
        copy_tree(&root, &check);
        run_to(&check, ranks).flag("--resume").run_ok();
        assert_eq!(latest_step(&check), Some(STEPS));
        assert_published_valid(&check);
        assert!(tmp_entries(&check).is_empty(), "{:?}", tmp_entries(&check));
        assert_same_files(&step_dir(&base, STEPS), &step_dir(&check, STEPS));
        // Retained checkpoints written after the resume match the reference too.
        for s in (STEPS - SAVE_EVERY * (KEEP_LAST - 1)..STEPS).filter(|s| s % SAVE_EVERY == 0) {
            if step_dir(&check, s).exists() {
                assert_same_files(&step_dir(&base, s), &step_dir(&check, s));
            }
        }
    }
    eprintln!(
        "kill matrix ({ranks} rank(s)): {landed} kills landed in {attempts} attempts over {} chains, {:.1} s",
        chain + 1,
        t_all.elapsed().as_secs_f64()
    );
    for (ph, n) in &phases {
        eprintln!("  {n:4}  {ph}");
    }
}
