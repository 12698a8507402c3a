//! The node-local memory tier on 4 ZeRO-1 ranks as 2 simulated nodes (ranks 0-1 on node 0,
//! ranks 2-3 on node 1, each node its own directory), `per-rank` shards, every case both on
//! rank threads and under `mpirun -n 4 --dist mpi` (4 processes; skipped, saying so, without
//! `mpirun`): a trainer killed mid-run resumes from the newest step every rank can restore,
//! newer than the disk's, from its own node's tier, from a peer's replica when its node was
//! wiped, or from disk when both copies of a part are gone, and ends with the bytes of an
//! uninterrupted run (on threads).

mod common;

use std::path::{Path, PathBuf};

use burn_ckpt::ckpt_burn::{MODEL_FILE, SCHEDULER_FILE, TRAINER_FILE};
use burn_ckpt::ckpt_core;
use common::{Finished, Trainer, step_dir, trainer};

const STEPS: u64 = 16;
const DISK_EVERY: u64 = 4;
/// The disk save of step 12 waited for step 8's (one in flight): the disk holds 8, maybe 12.
const KILL_AT: u64 = 13;

#[test]
fn child_entry() {
    common::child_entry();
}

/// Where the 4 ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ranks {
    /// Threads of one trainer process.
    Threads,
    /// 4 MPI processes under `mpirun`.
    Mpi,
}

/// Threads, and MPI where `mpirun` is installed (and the `mpi` feature built).
fn launches() -> Vec<Ranks> {
    let mut v = vec![Ranks::Threads];
    if cfg!(feature = "mpi") && trainer(Path::new("x")).mpirun_command(4).is_some() {
        v.push(Ranks::Mpi);
    } else {
        eprintln!("SKIP (MPI half): mpirun not found or no `mpi` feature");
    }
    v
}

/// Runs `t` on `ranks` to its end.
fn exec(t: Trainer, ranks: Ranks) -> Finished {
    match ranks {
        Ranks::Threads => t.run(),
        Ranks::Mpi => {
            let t0 = std::time::Instant::now();
            let out = t
                .arg("--dist", "mpi")
                .mpirun_command(4)
                .expect("mpirun")
                .output()
                .expect("running mpirun");
            Finished {
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                elapsed: t0.elapsed(),
            }
        }
    }
}

/// [`exec`], which must succeed.
fn exec_ok(t: Trainer, ranks: Ranks) -> Finished {
    let f = exec(t, ranks);
    assert!(f.status.success(), "{ranks:?} run failed:\n{}", f.stderr);
    f
}

/// 4 ranks, 2 per node, disk saves every 4 steps, a memory save every step (each one
/// waited for, so the tier holds step 13 when the run is killed there).
fn run(root: &Path, tier: &Path) -> Trainer {
    tiered(root, tier)
        .arg("--memory-budget", "off")
        .failpoint("memory_tier_wait", "return")
}

/// 4 ranks, 2 per node, disk saves every 4 steps, the memory tier's own defaults.
fn tiered(root: &Path, tier: &Path) -> Trainer {
    trainer(root)
        .steps(STEPS)
        .save_every(DISK_EVERY)
        .arg("--keep-last", 2)
        .arg("--ranks", 4)
        .flag("--replicate-data")
        .arg("--shard-format", "per-rank")
        .arg("--memory-tier", format!("{}/node-{{node}}", tier.display()))
        .arg("--ranks-per-node", 2)
}

fn files() -> Vec<String> {
    let mut f: Vec<String> = vec![
        MODEL_FILE.into(),
        SCHEDULER_FILE.into(),
        TRAINER_FILE.into(),
    ];
    f.extend((0..4).map(|r| burn_ckpt::ckpt_zero::shards::shard_file_name(r, 4)));
    f
}

/// The uninterrupted run's final checkpoint.
fn reference(tmp: &Path) -> PathBuf {
    let root = tmp.join("reference");
    run(&root, &tmp.join("reference-tier")).run_ok();
    step_dir(&root, STEPS)
}

fn assert_same_final(reference: &Path, root: &Path) {
    for f in files() {
        assert_eq!(
            std::fs::read(reference.join(&f)).unwrap(),
            std::fs::read(step_dir(root, STEPS).join(&f)).unwrap(),
            "{f} of the resumed run differs from the uninterrupted run's"
        );
    }
}

/// The newest disk checkpoint of a killed run as start-up recovery will find it: the newest
/// step directory that fully verifies. Not what `latest` names: a kill between publishing a
/// step's directory and moving `latest` leaves `latest` one save behind (recovery repairs it).
fn newest_valid(root: &Path) -> u64 {
    ckpt_core::list_checkpoints(root, true)
        .unwrap()
        .into_iter()
        .filter(|c| matches!(c.status, ckpt_core::CheckpointStatus::Verified))
        .map(|c| c.step)
        .max()
        .expect("the killed run left no valid disk checkpoint")
}

/// The newest disk checkpoint of a killed run: 8, or 12 if its save finished in time.
fn disk_newest(root: &Path) -> u64 {
    let step = newest_valid(root);
    assert!(step == 8 || step == 12, "disk newest {step}");
    step
}

/// Kills a run at step 13 (every rank aborts there); returns its root and tier directory.
fn killed(tmp: &Path, name: &str, ranks: Ranks) -> (PathBuf, PathBuf) {
    let name = format!("{name}-{ranks:?}");
    let (root, tier) = (tmp.join(&name), tmp.join(format!("{name}-tier")));
    let f = exec(run(&root, &tier).arg("--abort-at-step", KILL_AT), ranks);
    assert!(
        !f.status.success(),
        "the killed run exited cleanly:\n{}",
        f.stderr
    );
    disk_newest(&root);
    (root, tier)
}

/// The first step of the resumed run (`done: steps A..B`).
fn resumed_at(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("done: steps "))
        .unwrap_or_else(|| panic!("no done line in:\n{stderr}"));
    line["done: steps ".len()..]
        .split("..")
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The one `run-*` directory of a node's tier.
fn run_dir(tier: &Path, node: usize) -> PathBuf {
    let node = tier.join(format!("node-{node}"));
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&node)
        .unwrap_or_else(|e| panic!("{}: {e}", node.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("run-"))
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.remove(0)
}

/// The `step-*` directories of a tier root.
fn steps_in(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("step-")
        })
        .collect();
    v.sort();
    v
}

fn flip_a_byte(file: &Path) {
    let mut b = std::fs::read(file).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x40;
    std::fs::write(file, b).unwrap();
}

fn assert_tier_removed(tier: &Path) {
    for node in 0..2 {
        let d = tier.join(format!("node-{node}"));
        let left: Vec<_> = std::fs::read_dir(&d)
            .map(|rd| rd.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "a clean finish left {left:?}");
    }
}

#[test]
fn a_crashed_process_resumes_from_its_own_nodes_tier() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    for ranks in launches() {
        let (root, tier) = killed(tmp.path(), "crash", ranks);
        let f = exec_ok(run(&root, &tier).flag("--resume"), ranks);
        assert_eq!(resumed_at(&f.stderr), KILL_AT, "{ranks:?}:\n{}", f.stderr);
        assert!(
            f.stderr.contains("memory tier: rank 0 from its own part"),
            "{ranks:?}:\n{}",
            f.stderr
        );
        assert!(
            !f.stderr.contains("restored from rank"),
            "{ranks:?}: no rank needed a replica:\n{}",
            f.stderr
        );
        assert_same_final(&reference, &root);
        assert_tier_removed(&tier);
    }
}

#[test]
fn a_lost_node_resumes_from_its_peers_replicas() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    for ranks in launches() {
        // Node 1 (ranks 2, 3), then node 0 (ranks 0, 1: rank 0's part holds the model).
        for (lost, restored_from) in [(1, [0, 1]), (0, [2, 3])] {
            let (root, tier) = killed(tmp.path(), &format!("lost-node-{lost}"), ranks);
            std::fs::remove_dir_all(tier.join(format!("node-{lost}"))).unwrap();
            let f = exec_ok(run(&root, &tier).flag("--resume"), ranks);
            assert_eq!(
                resumed_at(&f.stderr),
                KILL_AT,
                "{ranks:?}, node {lost} lost:\n{}",
                f.stderr
            );
            for h in restored_from {
                assert!(
                    f.stderr
                        .contains(&format!("restored from rank {h}'s replica")),
                    "{ranks:?}, node {lost} lost: no part came back from rank {h}:\n{}",
                    f.stderr
                );
            }
            assert_same_final(&reference, &root);
            assert_tier_removed(&tier);
        }
    }
}

#[test]
fn both_copies_of_a_part_lost_fall_back_to_disk_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    for ranks in launches() {
        let (root, tier) = killed(tmp.path(), "both-lost", ranks);
        let disk = disk_newest(&root);
        // Rank 2's own part goes with node 1; rank 0 keeps its replica: corrupt every step.
        std::fs::remove_dir_all(tier.join("node-1")).unwrap();
        let replica = run_dir(&tier, 0).join("replica-2-of-4");
        let shard = burn_ckpt::ckpt_zero::shards::shard_file_name(2, 4);
        let corrupted = steps_in(&replica);
        assert!(!corrupted.is_empty());
        for s in &corrupted {
            flip_a_byte(&s.join(&shard));
        }
        let f = exec_ok(run(&root, &tier).flag("--resume"), ranks);
        assert_eq!(resumed_at(&f.stderr), disk, "{ranks:?}:\n{}", f.stderr);
        assert!(
            f.stderr.contains("rank 2's part has no valid copy"),
            "{ranks:?}:\n{}",
            f.stderr
        );
        for s in &corrupted {
            assert!(
                f.stderr.contains(&s.display().to_string()),
                "{ranks:?}: the warning should name {}:\n{}",
                s.display(),
                f.stderr
            );
        }
        assert_same_final(&reference, &root);
    }
}

#[test]
fn a_replicas_flipped_byte_is_caught_and_the_own_part_used() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    for ranks in launches() {
        let (root, tier) = killed(tmp.path(), "flipped", ranks);
        let replica = run_dir(&tier, 1).join("replica-0-of-4");
        let newest = steps_in(&replica).pop().unwrap();
        flip_a_byte(&newest.join(MODEL_FILE));
        let f = exec_ok(run(&root, &tier).flag("--resume"), ranks);
        assert_eq!(resumed_at(&f.stderr), KILL_AT, "{ranks:?}:\n{}", f.stderr);
        assert!(
            f.stderr.contains(&newest.display().to_string()) && f.stderr.contains("invalid"),
            "{ranks:?}: the flipped byte of {} went unnoticed:\n{}",
            newest.display(),
            f.stderr
        );
        assert_same_final(&reference, &root);
    }
}

#[test]
fn a_stale_tier_of_another_run_is_never_read() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    for ranks in launches() {
        // Another run crashes and leaves its tier behind.
        let (_, tier) = killed(tmp.path(), "other", ranks);
        // This run uses the same tier directory: a resume in its empty root starts at step 0
        // (reading the other run's parts, of the same seed, would resume later).
        let root = tmp.path().join(format!("this-{ranks:?}"));
        let f = exec_ok(run(&root, &tier).flag("--resume"), ranks);
        assert_eq!(resumed_at(&f.stderr), 0, "{ranks:?}:\n{}", f.stderr);
        assert_same_final(&reference, &root);

        // A part of another run (another seed: other bytes) planted under this run's own
        // directory is refused by its manifest's run id.
        let (root, tier) = killed(tmp.path(), "planted", ranks);
        let other = tmp.path().join(format!("other-seed-{ranks:?}"));
        let other_tier = tmp.path().join(format!("other-seed-{ranks:?}-tier"));
        exec(
            run(&other, &other_tier)
                .arg("--seed", 11)
                .arg("--abort-at-step", KILL_AT),
            ranks,
        );
        let theirs = run_dir(&other_tier, 0).join("rank-1-of-4");
        let ours = run_dir(&tier, 0).join("rank-1-of-4");
        for s in steps_in(&ours) {
            std::fs::remove_dir_all(&s).unwrap();
            let name = s.file_name().unwrap();
            if theirs.join(name).exists() {
                copy_dir(&theirs.join(name), &s);
            }
        }
        let f = exec_ok(run(&root, &tier).flag("--resume"), ranks);
        assert_eq!(resumed_at(&f.stderr), KILL_AT, "{ranks:?}:\n{}", f.stderr);
        assert!(f.stderr.contains("another run"), "{ranks:?}:\n{}", f.stderr);
        assert!(
            f.stderr.contains("restored from rank 3's replica"),
            "{ranks:?}: rank 1's part should come from its replica:\n{}",
            f.stderr
        );
        assert_same_final(&reference, &root);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A memory-tier step older than the disk's newest is never chosen: memory saves every 11
/// steps (step 11 whole in every tier), disk saves every 4, killed at 17 (the disk then holds
/// 12 or 16): the run resumes from the disk.
#[test]
fn an_older_memory_step_is_never_chosen_over_the_disks() {
    let tmp = tempfile::tempdir().unwrap();
    for ranks in launches() {
        let root = tmp.path().join(format!("older-{ranks:?}"));
        let tier = tmp.path().join(format!("older-{ranks:?}-tier"));
        let t = run(&root, &tier).steps(20).arg("--memory-every", 11);
        let f = exec(t.clone().arg("--abort-at-step", 17), ranks);
        assert!(!f.status.success(), "{}", f.stderr);
        let disk = newest_valid(&root);
        assert!(disk == 12 || disk == 16, "{ranks:?}: disk newest {disk}");
        assert!(!steps_in(&run_dir(&tier, 0).join("rank-0-of-4")).is_empty());
        let f = exec_ok(t.flag("--resume"), ranks);
        assert_eq!(resumed_at(&f.stderr), disk, "{ranks:?}:\n{}", f.stderr);
    }
}

/// The overhead budget holds: with each memory save's submit made to cost 100 ms of
/// training (failpoint `memory_tier_submit`) and each save waited for, a run under the default 5 % budget takes few
/// of its due saves, says how many it skipped for the budget and reports the cost it
/// measured within the budget's reach; the same run with the budget off takes every one.
/// The run is longer than the warm-up's limit (ten times its 5 steps): before it, the
/// measuring save is taken only at a step where rank 0's step times have settled, which a run
/// of microsecond steps on a busy machine may never see.
#[test]
fn the_overhead_budget_throttles_costly_saves() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 60;
    let go = |budget: &str| {
        let root = tmp.path().join(format!("budget-{budget}"));
        let report = tmp.path().join(format!("budget-{budget}.json"));
        tiered(&root, &tmp.path().join(format!("budget-{budget}-tier")))
            .steps(steps)
            .save_every(1000)
            .arg("--memory-budget", budget)
            .failpoint("memory_tier_submit", "sleep(100)")
            .failpoint("memory_tier_wait", "return")
            .arg("--report", report.display())
            .run_ok();
        common::read_report(&report)["memory_tier"].clone()
    };
    let off = go("off");
    let saved = |m: &serde_json::Value| m["saved"].as_array().unwrap().len() as u64;
    assert_eq!(saved(&off), steps, "budget off: every step saved: {off}");
    assert_eq!(off["throttled"], 0, "{off}");
    let lost = |m: &serde_json::Value| m["lost_s"].as_f64().expect("a measured cost");
    let on = go("0.05");
    assert!(
        saved(&on) >= 1 && saved(&on) <= steps / 4,
        "5 % budget: took {} of {steps} costly saves: {on}",
        saved(&on)
    );
    // Every due save is accounted for: taken or over the budget. None is skipped: each save
    // is waited for (the failpoint), so no rank is busy at the next, and another rank's own
    // account does not veto rank 0's decision (it did, and a rank whose steps had not
    // settled kept the measuring save from ever being taken).
    let (throttled, skipped) = (
        on["throttled"].as_u64().unwrap(),
        on["skipped"].as_u64().unwrap(),
    );
    assert_eq!(skipped, 0, "{on}");
    assert_eq!(saved(&on) + throttled, steps, "{on}");
    // After the measuring save (by step 51 at the latest) every due save is over the budget.
    assert!(throttled >= 5, "{on}");
    // The save taken after the warm-up measured the cost, its 100 ms stall included.
    assert!(lost(&on) >= 0.1 * saved(&on) as f64, "{on}");
    assert!(on["training_s"].as_f64().unwrap() > lost(&on), "{on}");
}

/// A rank's tier thread that dies in the middle of a memory save (after its own part, before
/// the exchange) turns the tier off with an error on every rank; training and disk saves go
/// on to the end, and the run's final checkpoint is the uninterrupted run's (on threads: one
/// process, where a panic is contained in its thread).
#[test]
fn a_tier_thread_dying_mid_save_turns_the_tier_off_and_training_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    let root = tmp.path().join("dies");
    let t0 = std::time::Instant::now();
    let f = run(&root, &tmp.path().join("dies-tier"))
        .failpoint("memory_tier_die", "return(1@6)")
        .run_ok();
    assert!(
        f.stderr.contains("memory tier off") && f.stderr.contains("OFF after a failure"),
        "no error that the tier went off:\n{}",
        f.stderr
    );
    assert!(
        !f.stderr
            .contains("skipped because the previous one was still running"),
        "saves after the tier went off are not skipped ones:\n{}",
        f.stderr
    );
    assert_same_final(&reference, &root);
    let said: Vec<&str> = f.stderr.lines().filter(|l| l.contains("tier")).collect();
    eprintln!("a dying tier thread: {:?}, said {said:#?}", t0.elapsed());
}

/// A rank's tier thread that panics while writing its part (a bug in capture or encoding)
/// fails that save as an error would, on threads and under MPI, where nothing would tell the
/// peers that the thread is gone and their tier threads would wait for it to the end: a warning
/// names the panic, the tier stays on, later saves are whole, and the run ends with the
/// uninterrupted run's bytes.
#[test]
fn a_panic_writing_a_part_fails_that_save_and_the_tier_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    for ranks in launches() {
        let root = tmp.path().join(format!("panics-{ranks:?}"));
        let tier = tmp.path().join(format!("panics-{ranks:?}-tier"));
        let f = exec_ok(
            run(&root, &tier).failpoint("memory_tier_panic", "return(1@5)"),
            ranks,
        );
        assert!(
            f.stderr
                .contains("memory-tier save is not whole on every rank")
                && f.stderr
                    .contains("rank 1's memory-tier thread panicked writing its part of step 5"),
            "{ranks:?}: no warning naming the panic:\n{}",
            f.stderr
        );
        let summary = f.line("memory tier: ").unwrap_or_default().to_string();
        assert!(
            summary.starts_with(&format!("memory tier: {} saves whole", STEPS - 1))
                && summary.contains("1 not whole")
                && !summary.contains("OFF"),
            "{ranks:?}: {summary}\n{}",
            f.stderr
        );
        assert_same_final(&reference, &root);
    }
}

/// A rank whose part of a memory save fails (as on a full tmpfs) makes that save not whole on
/// every rank, with a warning, and training goes on; the later saves are whole.
#[test]
fn a_failed_part_is_a_warning_and_later_saves_are_whole() {
    let tmp = tempfile::tempdir().unwrap();
    for ranks in launches() {
        let root = tmp.path().join(format!("failed-part-{ranks:?}"));
        let tier = tmp.path().join(format!("failed-part-{ranks:?}-tier"));
        let f = exec_ok(
            run(&root, &tier).failpoint("memory_tier_part", "return(2@5)"),
            ranks,
        );
        assert!(
            f.stderr
                .contains("memory-tier save is not whole on every rank")
                && f.stderr.contains("failpoint memory_tier_part"),
            "{ranks:?}: no warning:\n{}",
            f.stderr
        );
        let summary = f.line("memory tier: ").unwrap_or_default().to_string();
        assert!(
            summary.starts_with(&format!("memory tier: {} saves whole", STEPS - 1))
                && summary.contains("1 not whole"),
            "{ranks:?}: {summary}\n{}",
            f.stderr
        );
    }
}

/// With an object-store tier (`--upload-to`, a real S3-compatible server) beside the memory
/// tier, recovery asks the memory tier first and downloads only when it holds nothing as new:
/// a run killed at step 13 whose local checkpoints are gone resumes from the memory tier at 13
/// without a download (the object store holds 8 or 12); with its memory tier wiped too, rank 0
/// downloads the object store's newest and every rank resumes from it. Both end with the
/// uninterrupted run's bytes.
#[cfg(feature = "remote")]
#[test]
fn the_object_store_is_downloaded_from_only_when_no_memory_step_is_as_new() {
    use test_support::s3::{BUCKET, Moto, s3_env};
    let moto = Moto::start();
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    for ranks in launches() {
        for wipe_tier in [false, true] {
            let name = format!("tiers-{ranks:?}-{wipe_tier}");
            let url = format!("s3://{BUCKET}/{name}");
            let with_s3 = |t: Trainer| {
                let mut t = t.arg("--upload-to", &url);
                for (k, v) in s3_env(&moto.endpoint()) {
                    t = t.env(k, v);
                }
                t
            };
            let (root, tier) = (tmp.path().join(&name), tmp.path().join(format!("{name}-t")));
            let f = exec(
                with_s3(run(&root, &tier)).arg("--abort-at-step", KILL_AT),
                ranks,
            );
            assert!(!f.status.success(), "{}", f.stderr);
            disk_newest(&root);
            let remote = ckpt_demo::remote::Remote::open(
                &url,
                ckpt_demo::remote::RemoteConfig {
                    store_options: test_support::s3::store_options(&moto.endpoint()),
                    ..Default::default()
                },
            )
            .unwrap();
            let uploaded = remote
                .list()
                .unwrap()
                .into_iter()
                .filter(|c| c.invalid.is_none())
                .map(|c| c.step)
                .max()
                .expect("the killed run uploaded no checkpoint");
            // The local checkpoints are lost; the run id stays (the tier is this run's).
            for entry in std::fs::read_dir(&root).unwrap() {
                let p = entry.unwrap().path();
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                if n.starts_with("step-") {
                    std::fs::remove_dir_all(&p).unwrap();
                } else if n == "latest" {
                    std::fs::remove_file(&p).unwrap();
                }
            }
            if wipe_tier {
                std::fs::remove_dir_all(&tier).unwrap();
            }
            let f = exec_ok(with_s3(run(&root, &tier)).flag("--resume"), ranks);
            let downloaded = format!("downloaded from {url}/step-{uploaded:08}");
            if wipe_tier {
                assert_eq!(resumed_at(&f.stderr), uploaded, "{ranks:?}:\n{}", f.stderr);
                assert!(
                    f.stderr.contains("restored the checkpoint from")
                        && f.stderr.contains(&downloaded),
                    "{ranks:?}: no download of step {uploaded}:\n{}",
                    f.stderr
                );
            } else {
                assert_eq!(resumed_at(&f.stderr), KILL_AT, "{ranks:?}:\n{}", f.stderr);
                assert!(
                    f.stderr.contains("memory tier: rank 0 from its own part")
                        && !f.stderr.contains("downloaded from")
                        && !f.stderr.contains("restored the checkpoint from"),
                    "{ranks:?}: the memory tier's step 13 is newer than the object store's \
                     {uploaded}: nothing to download:\n{}",
                    f.stderr
                );
            }
            assert_same_final(&reference, &root);
        }
    }
}
