//! End-to-end tests of the example trainer (`ckpt_demo::run`, the code behind
//! `examples/train.rs`): exact resume after real process aborts, async/sync byte identity,
//! byte identity with Burn's own checkpointer, and typed errors on bad input.
//!
//! Training runs in child processes (this test binary re-executed with a run spec in the
//! environment): the backend RNG is process-global, so runs must not share a process, and an
//! abort must kill a whole process, in-flight saves included.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use burn::module::Module;
use burn::tensor::Device;
use burn_ckpt::ckpt_burn::{
    self as cb, Error, MODEL_FILE, OPTIM_FILE, OptimizerRead, SCHEDULER_FILE, SaveTuning,
    TRAINER_FILE, TrainerState, UpdateWait,
};
use burn_ckpt::ckpt_core::{self, Engine, EngineConfig, Snapshot};
use ckpt_demo::{self as demo, DemoConfig, Frequency, Mlp, SaveMode};
use test_support::fs::{At, flip_byte, step_dir};

const CHILD: &str = "BURN_CKPT_TRAIN_CHILD";
const FILES: [&str; 4] = [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE];

/// Small, fast settings: 100 samples in batches of 8 (an epoch is 12.5 batches, so epochs and
/// saves never line up), dropout on.
fn small_config(kv: &HashMap<String, String>) -> DemoConfig {
    let mut cfg = DemoConfig::new(&kv["dir"]);
    cfg.hidden = 32;
    cfg.layers = 2;
    cfg.batch_size = 8;
    cfg.dataset_size = 100;
    cfg.dropout = 0.2;
    cfg.keep_last = None;
    cfg.steps = kv["steps"].parse().unwrap();
    cfg.frequency = Frequency::EverySteps(kv.get("save_every").map_or(6, |v| v.parse().unwrap()));
    cfg.seed = kv.get("seed").map_or(7, |v| v.parse().unwrap());
    cfg.resume = kv.contains_key("resume");
    cfg.init_from = kv.get("init_from").map(PathBuf::from);
    cfg.abort_at_step = kv.get("abort_at").map(|v| v.parse().unwrap());
    cfg.save_mode = match kv.get("mode").map(String::as_str) {
        Some("sync") => SaveMode::Sync,
        Some("burn") => SaveMode::Burn,
        _ => SaveMode::Async,
    };
    let budget = kv.get("snapshot_budget").map(|v| v.parse().unwrap());
    let update_wait = match kv.get("update_wait").map(String::as_str) {
        Some("always") => UpdateWait::Always,
        Some("never") => UpdateWait::Never,
        _ => UpdateWait::Auto,
    };
    let optimizer_read = match kv.get("optimizer_read").map(String::as_str) {
        Some("background") => OptimizerRead::Background,
        Some("at_capture") => OptimizerRead::AtCapture,
        _ => OptimizerRead::Auto,
    };
    // No snapshot budget unless the case gives one (the trainer's default is `auto`).
    cfg.tuning = SaveTuning::default()
        .memory_budget(budget)
        .optimizer_read(optimizer_read)
        .update_wait(update_wait);
    #[cfg(feature = "wgpu")]
    if kv.get("backend").map(String::as_str) == Some("wgpu") {
        cfg.backend = demo::Backend::Wgpu;
    }
    cfg
}

/// The child side: runs one training when the spec is in the environment, else does nothing.
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let kv: HashMap<String, String> = spec
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(ms) = kv.get("slow_persist_ms") {
        fail::cfg(ckpt_core::failpoints::RENAME, &format!("sleep({ms})")).unwrap();
    }
    // Holds every save's staging and every part back before they read the state: the trainer
    // runs on meanwhile, so the persist reads handles the trainer has moved past.
    if let Some(ms) = kv.get("hold_ms") {
        fail::cfg(
            burn_ckpt::ckpt_burn::STAGE_FAILPOINT,
            &format!("sleep({ms})"),
        )
        .unwrap();
        fail::cfg(ckpt_core::failpoints::WRITE_PART, &format!("sleep({ms})")).unwrap();
    }
    // Holds only the parts back: staging runs at once.
    if let Some(ms) = kv.get("hold_write_ms") {
        fail::cfg(ckpt_core::failpoints::WRITE_PART, &format!("sleep({ms})")).unwrap();
    }
    let cfg = small_config(&kv);
    match demo::run(&cfg, &mut |_| {}) {
        Ok(report) => {
            let mut json = serde_json::to_value(&report).unwrap();
            // What snapshots still hold once the run is done (it waited for every save).
            json["pinned_after_run"] = burn_ckpt::ckpt_burn::pinned_state_bytes().into();
            let json = serde_json::to_string(&json).unwrap();
            std::fs::write(Path::new(&kv["dir"]).join("report.json"), json).unwrap();
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("TRAIN-ERROR: {e}");
            std::process::exit(3)
        }
    }
}

fn train(dir: &Path, spec: &[(&str, String)]) -> Output {
    let mut s = format!("dir={}\n", dir.display());
    for (k, v) in spec {
        s.push_str(&format!("{k}={v}\n"));
    }
    Command::new(std::env::current_exe().unwrap())
        .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, s)
        .output()
        .unwrap()
}

fn train_ok(dir: &Path, spec: &[(&str, String)]) -> serde_json::Value {
    let out = train(dir, spec);
    assert!(
        out.status.success(),
        "training failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap()
}

fn assert_same_files(a: &Path, b: &Path) {
    for f in FILES {
        let (x, y) = (
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
        );
        assert!(
            x == y,
            "{f} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// A snapshot counts the state it holds clones of until it is staged or read out, and gives
/// all of it back: with its staging and its writes held back, the first save pins the whole
/// state when the next update runs; held or not, nothing is left once the run is done.
#[test]
fn a_snapshot_pins_the_state_until_read_and_gives_all_of_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let held = train_ok(
        &tmp.path().join("held"),
        &[("steps", s(9)), ("save_every", s(4)), ("hold_ms", s(300))],
    );
    let samples = held["pinned_at_next_update"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{samples:?}");
    let model = std::fs::metadata(step_dir(&tmp.path().join("held"), 4).join(MODEL_FILE))
        .unwrap()
        .len();
    for sample in samples {
        assert_eq!(
            sample["update_step"],
            sample["save_step"].as_u64().unwrap() + 1
        );
    }
    // The model's tensors and the optimizer state (AdamW: two moments per parameter). Only the
    // first save is checked: the second waits for the first's persist slot after its snapshot
    // is made, and its staging may be done by the time training goes on.
    let pinned = samples[0]["bytes"].as_u64().unwrap();
    assert!(
        pinned > 2 * model,
        "pinned {pinned} bytes, model.bpk has {model}"
    );
    assert_eq!(held["pinned_after_run"], 0);
    let free = train_ok(
        &tmp.path().join("free"),
        &[("steps", s(9)), ("save_every", s(4))],
    );
    assert_eq!(free["pinned_after_run"], 0);
    assert_eq!(free["pinned_at_next_update"].as_array().unwrap().len(), 2);
}

/// With the wait before updates (`update_wait` always; by default on device backends only),
/// no update runs while a snapshot still holds the state, even with the staging held back:
/// every update writes in place, the wait is counted in the save's stall, and the files are
/// still the captured step's (those of a blocking save from the same start).
#[test]
fn updates_wait_for_the_staging_and_the_files_are_still_the_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let init_root = tmp.path().join("init");
    train_ok(&init_root, &[("steps", s(2)), ("seed", s(5))]);
    let init = step_dir(&init_root, 2).display().to_string();
    let waited = tmp.path().join("waited");
    let r = train_ok(
        &waited,
        &[
            ("steps", s(9)),
            ("save_every", s(4)),
            ("init_from", init.clone()),
            ("hold_ms", s(300)),
            ("update_wait", s("always")),
        ],
    );
    let samples = r["pinned_at_next_update"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{samples:?}");
    let saves = r["saves"].as_array().unwrap();
    for sample in samples {
        assert_eq!(
            sample["bytes"], 0,
            "an update ran with state held: {sample}"
        );
        let wait = sample["update_wait_ms"].as_f64().unwrap();
        let save = saves
            .iter()
            .find(|x| x["step"] == sample["save_step"])
            .unwrap();
        assert!(
            save["stall_ms"].as_f64().unwrap() >= wait,
            "{save} {sample}"
        );
    }
    // The first save's staging was held back 300 ms, and the step's own work takes far less.
    // (The second save waits for the first's persist slot at its submit, by which time its
    // staging is done.)
    let first = samples[0]["update_wait_ms"].as_f64().unwrap();
    assert!(first > 100.0, "the update did not wait: {}", samples[0]);
    let sync = tmp.path().join("sync");
    train_ok(
        &sync,
        &[
            ("steps", s(9)),
            ("save_every", s(4)),
            ("init_from", init),
            ("mode", s("sync")),
        ],
    );
    for st in [4, 8, 9] {
        assert_same_files(&step_dir(&waited, st), &step_dir(&sync, st));
    }
}

#[test]
fn exact_resume_after_aborts_matches_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 40u64;
    let base = tmp.path().join("uninterrupted");
    train_ok(&base, &[("steps", s(steps))]);
    // Training moves the state, so byte identity below is not trivially true.
    assert_ne!(
        std::fs::read(step_dir(&base, 36).join(MODEL_FILE)).unwrap(),
        std::fs::read(step_dir(&base, steps).join(MODEL_FILE)).unwrap()
    );

    // Each chain aborts the run at one or more steps (a real `abort()`), then resumes to the
    // end. Phases: (abort step, save mode, slow persist ms, step the phase must resume from;
    // None where a fast async persist makes it racy).
    type Phase = (Option<u64>, &'static str, Option<u64>, Option<u64>);
    let chains: Vec<(&str, Vec<Phase>)> = vec![
        // Mid-epoch, between saves.
        (
            "mid-epoch",
            vec![
                (Some(9), "sync", None, None),
                (None, "async", None, Some(6)),
            ],
        ),
        // Twice: first mid-epoch 1 (after 6 and 12 are durable), then right after step 18's
        // save was submitted, while it is still in flight (it never publishes).
        (
            "in-flight",
            vec![
                (Some(13), "sync", None, None),
                (Some(18), "async", Some(400), Some(12)),
                (None, "async", None, Some(12)),
            ],
        ),
        // Just after an epoch boundary, async all along: whatever was durable is resumed from.
        (
            "async",
            vec![(Some(27), "async", None, None), (None, "async", None, None)],
        ),
    ];
    for (name, phases) in chains {
        let dir = tmp.path().join(name);
        let mut from_seen = 0;
        for (i, (abort_at, mode, slow, from)) in phases.into_iter().enumerate() {
            let mut spec = vec![("steps", s(steps)), ("mode", s(mode))];
            if i > 0 {
                spec.push(("resume", s(1)));
            }
            if let Some(ms) = slow {
                spec.push(("slow_persist_ms", s(ms)));
            }
            let _ = std::fs::remove_file(dir.join("report.json"));
            match abort_at {
                Some(k) => {
                    spec.push(("abort_at", s(k)));
                    let out = train(&dir, &spec);
                    assert!(
                        !out.status.success(),
                        "{name}: the run did not abort at {k}"
                    );
                    assert!(!dir.join("report.json").exists());
                    if slow.is_some() {
                        assert!(
                            !step_dir(&dir, k).exists(),
                            "{name}: the save at {k} should have died in flight"
                        );
                    }
                }
                None => {
                    let report = train_ok(&dir, &spec);
                    from_seen = report["start_step"].as_u64().unwrap();
                    if let Some(f) = from {
                        assert_eq!(from_seen, f, "{name}: resumed from the wrong step");
                    }
                }
            }
        }
        assert_same_files(&step_dir(&base, steps), &step_dir(&dir, steps));
        // Every checkpoint written after the resume matches too.
        for st in (from_seen + 1..steps).filter(|st| st % 6 == 0) {
            assert_same_files(&step_dir(&base, st), &step_dir(&dir, st));
        }
    }
}

#[test]
fn resume_with_a_different_seed_diverges() {
    // The guard for the test above: a different seed gives different bytes.
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    train_ok(&a, &[("steps", s(12))]);
    train_ok(&b, &[("steps", s(12)), ("seed", s(8))]);
    let model = |d: &Path| std::fs::read(step_dir(d, 12).join(MODEL_FILE)).unwrap();
    assert_ne!(model(&a), model(&b));
}

#[test]
fn async_and_sync_write_identical_bytes_from_the_same_init() {
    let tmp = tempfile::tempdir().unwrap();
    let init_root = tmp.path().join("init");
    train_ok(&init_root, &[("steps", s(6)), ("seed", s(99))]);
    let init = step_dir(&init_root, 6);
    let a = tmp.path().join("async");
    let b = tmp.path().join("sync");
    // The async run's persists are slowed down, so the trainer runs many steps past each
    // snapshot before its records are encoded: the bytes must still be those of the step.
    let ra = train_ok(
        &a,
        &[
            ("steps", s(18)),
            ("init_from", s(init.display())),
            ("hold_ms", s(100)),
        ],
    );
    let rb = train_ok(
        &b,
        &[
            ("steps", s(18)),
            ("init_from", s(init.display())),
            ("mode", s("sync")),
        ],
    );
    // Over a snapshot budget, training waits until what a save holds fits: same bytes.
    let c = tmp.path().join("blocking");
    let rc = train_ok(
        &c,
        &[
            ("steps", s(18)),
            ("init_from", s(init.display())),
            ("snapshot_budget", s(1)),
        ],
    );
    assert_eq!(rc["throttled_saves"], serde_json::json!([6, 12, 18]));
    assert_eq!(ra["throttled_saves"], serde_json::json!([]));
    for st in [6, 12, 18] {
        assert_same_files(&step_dir(&a, st), &step_dir(&b, st));
        assert_same_files(&step_dir(&a, st), &step_dir(&c, st));
    }
    assert_eq!(ra["saves"].as_array().unwrap().len(), 3);
    assert_eq!(rb["saves"].as_array().unwrap().len(), 3);
    // The report's lost time counts every stall (all of a sync save is stall) and the wait
    // for the saves still in flight at the end.
    for r in [&ra, &rb] {
        let lost = &r["lost"];
        let stalls: f64 = r["saves"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["stall_ms"].as_f64().unwrap())
            .sum();
        let (during, wait, total) = (
            lost["during_training_ms"].as_f64().unwrap(),
            lost["final_wait_ms"].as_f64().unwrap(),
            lost["total_ms"].as_f64().unwrap(),
        );
        assert!(during >= 0.999 * stalls, "{lost} < stalls {stalls}");
        assert!((total - during - wait).abs() < 1e-6, "{lost}");
        let per = lost["per_save_ms"].as_f64().unwrap();
        assert!((per * 3.0 - total).abs() < 1e-6, "{lost}");
    }
    // Persists slowed by 100 ms: the async run's last save is still in flight at the end.
    assert!(
        ra["lost"]["final_wait_ms"].as_f64().unwrap() > 50.0,
        "{}",
        ra["lost"]
    );
    // --init-from took the model, ParamIds included: a run without it differs.
    let plain = tmp.path().join("plain");
    train_ok(&plain, &[("steps", s(6))]);
    assert_ne!(
        std::fs::read(step_dir(&a, 6).join(MODEL_FILE)).unwrap(),
        std::fs::read(step_dir(&plain, 6).join(MODEL_FILE)).unwrap()
    );
}

#[test]
fn files_equal_burns_own_checkpointer_and_load_in_stock_burn() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = tmp.path().join("ours");
    let theirs = tmp.path().join("burn");
    train_ok(&ours, &[("steps", s(12))]);
    let rb = train_ok(&theirs, &[("steps", s(12)), ("mode", s("burn"))]);
    assert_eq!(rb["saves"].as_array().unwrap().len(), 2);
    for st in [6u64, 12] {
        let d = step_dir(&ours, st);
        for (ours_f, burn_name) in [
            (MODEL_FILE, "model"),
            (OPTIM_FILE, "optim"),
            (SCHEDULER_FILE, "scheduler"),
        ] {
            let burn_f = theirs
                .join("checkpoint")
                .join(format!("{burn_name}-{st}.bpk"));
            let mut theirs_bytes = std::fs::read(&burn_f).unwrap();
            if ours_f == OPTIM_FILE {
                // Burn's layout follows HashMap order; compare in the canonical layout.
                theirs_bytes = cb::canonicalize_optimizer_bytes(theirs_bytes).unwrap();
            }
            assert!(
                std::fs::read(d.join(ours_f)).unwrap() == theirs_bytes,
                "{ours_f} at step {st} differs from Burn's {}",
                burn_f.display()
            );
        }
    }
    // Stock Burn loads every file.
    let d = step_dir(&ours, 12);
    let device = Device::flex().autodiff();
    let record = burn::store::ModuleRecord::load(d.join(MODEL_FILE)).unwrap();
    Mlp::new(32, 2, 0.2, &device)
        .try_load_record(record)
        .unwrap();
    burn::optim::OptimizerRecord::load(d.join(OPTIM_FILE)).unwrap();
    let sched = burn::optim::lr_scheduler::LrSchedulerRecord::load(d.join(SCHEDULER_FILE)).unwrap();
    assert!(!sched.is_empty());
}

#[test]
fn model_bpk_equals_module_record_save() {
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let model = cb::assign_param_ids(Mlp::new(24, 3, 0.1, &device), 5);
    let ours = cb::encode_model(model.clone()).unwrap();
    let path = tmp.path().join("model.bpk");
    model.clone().into_record().save(&path).unwrap();
    assert_eq!(ours, std::fs::read(&path).unwrap());
    // ParamIds are a function of the seed: the same seed gives the same bytes.
    let again = cb::assign_param_ids(model, 5);
    assert_eq!(ours, cb::encode_model(again.clone()).unwrap());
    assert_ne!(
        ours,
        cb::encode_model(cb::assign_param_ids(again, 6)).unwrap()
    );
}

/// Publishes a checkpoint whose parts are `parts` (name, bytes) under a new root.
fn publish(root: &Path, step: u64, parts: Vec<(&str, Vec<u8>)>) -> PathBuf {
    let (mut engine, _) = Engine::open(EngineConfig::new(root)).unwrap();
    let mut snap = Snapshot::new(step);
    for (n, b) in parts {
        snap = snap.with_bytes(n, b);
    }
    engine.submit(snap).unwrap();
    engine.finish().unwrap();
    step_dir(root, step)
}

#[test]
fn bad_input_gives_typed_errors_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    train_ok(&run, &[("steps", s(6))]);
    let good = step_dir(&run, 6);
    let read = |f: &str| std::fs::read(good.join(f)).unwrap();
    let device = Device::flex().autodiff();
    let fresh = || {
        (
            Mlp::new(32, 2, 0.2, &device),
            burn::optim::AdamWConfig::new().init(),
            burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig::new(1e-3, 10)
                .init()
                .unwrap(),
        )
    };

    // The good checkpoint restores.
    let (m, o, sc) = fresh();
    let r = cb::restore(&good, m, o, sc).unwrap();
    assert_eq!(r.trainer.step, 6);

    // Wrong shapes: the error names the file, the tensor path and both shapes.
    let e = cb::load_model(&good, Mlp::new(16, 2, 0.2, &device)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::ModelMismatch { .. }), "{msg}");
    assert!(msg.contains("model.bpk"), "{msg}");
    assert!(msg.contains("layers.0.weight"), "{msg}");
    assert!(
        msg.contains("[16, 16]") && msg.contains("[16, 32]"),
        "{msg}"
    );

    // Missing file.
    let missing = tmp.path().join("missing");
    copy_dir(&good, &missing);
    std::fs::remove_file(missing.join(OPTIM_FILE)).unwrap();
    let (m, o, sc) = fresh();
    let e = cb::restore(&missing, m, o, sc).unwrap_err();
    assert!(
        matches!(e, Error::Core(ckpt_core::Error::Corrupt { .. })),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&missing.join(OPTIM_FILE).display().to_string()),
        "{e}"
    );

    // Corrupted file (one byte flipped).
    let corrupt = tmp.path().join("corrupt");
    copy_dir(&good, &corrupt);
    flip_byte(&corrupt.join(MODEL_FILE), At::Middle, 0x40);
    let e = cb::load_model(&corrupt, fresh().0).unwrap_err();
    assert!(
        e.to_string()
            .contains(&corrupt.join(MODEL_FILE).display().to_string()),
        "{e}"
    );

    // Garbage under a valid manifest: decoding fails, typed, naming the file.
    let dir = publish(
        &tmp.path().join("garbage"),
        6,
        vec![
            (MODEL_FILE, b"not a burnpack".to_vec()),
            (OPTIM_FILE, b"nope".to_vec()),
            (SCHEDULER_FILE, read(SCHEDULER_FILE)),
            (TRAINER_FILE, read(TRAINER_FILE)),
        ],
    );
    let e = cb::load_model(&dir, fresh().0).unwrap_err();
    assert!(matches!(e, Error::Record { .. }), "{e}");
    assert!(e.to_string().contains("model.bpk"), "{e}");
    let Err(e) = cb::load_optimizer(&dir, fresh().1) else {
        panic!("a garbage optim.bpk loaded");
    };
    assert!(e.to_string().contains("optim.bpk"), "{e}");

    // A newer trainer.bin is refused with a clear error naming it.
    let mut newer = read(TRAINER_FILE);
    newer[4..8].copy_from_slice(&(cb::TRAINER_STATE_VERSION + 1).to_le_bytes());
    let dir = publish(
        &tmp.path().join("newer"),
        6,
        FILES
            .iter()
            .map(|f| {
                (
                    *f,
                    if *f == TRAINER_FILE {
                        newer.clone()
                    } else {
                        read(f)
                    },
                )
            })
            .collect(),
    );
    let (m, o, sc) = fresh();
    let e = cb::restore(&dir, m, o, sc).unwrap_err();
    assert!(
        matches!(e, Error::NewerTrainerState { found, .. } if found == cb::TRAINER_STATE_VERSION + 1),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&dir.join(TRAINER_FILE).display().to_string()),
        "{e}"
    );
    assert!(TrainerState::from_bytes(&read(TRAINER_FILE), Path::new("t")).is_ok());

    // The trainer refuses a bad --init-from with a one-line error naming the path.
    let out = train(
        &tmp.path().join("bad-init"),
        &[
            ("steps", s(3)),
            ("init_from", s(tmp.path().join("nowhere").display())),
        ],
    );
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.starts_with("TRAIN-ERROR")).unwrap();
    assert!(line.contains("nowhere"), "{line}");
}

#[test]
fn resume_skips_a_corrupted_latest_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    train_ok(&base, &[("steps", s(24))]);
    let dir = tmp.path().join("run");
    train_ok(&dir, &[("steps", s(18))]);
    // Corrupt the newest checkpoint: the resume falls back to step 12 and still matches.
    flip_byte(&step_dir(&dir, 18).join(OPTIM_FILE), At::FromEnd(1), 1);
    let r = train_ok(&dir, &[("steps", s(24)), ("resume", s(1))]);
    assert_eq!(r["start_step"], 12);
    assert_same_files(&step_dir(&base, 24), &step_dir(&dir, 24));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The CubeCL code path (the one CUDA runs) through wgpu on Mesa's lavapipe: exact resume after
/// an abort mid-epoch and while a save is in flight, and snapshot immutability (an async
/// snapshot whose persist is held back while training runs on writes the bytes of a blocking
/// save at the same step). On CubeCL, records are lazy device reads and Adam's moments are
/// updated in place when their handle is unique, so this checks that capture by handle clones
/// really freezes the state there.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_exact_resume_and_snapshot_immutability() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 18u64;
    let wgpu = ("backend", s("wgpu"));
    let base = tmp.path().join("uninterrupted");
    train_ok(&base, &[("steps", s(steps)), wgpu.clone()]);
    assert_ne!(
        std::fs::read(step_dir(&base, 12).join(MODEL_FILE)).unwrap(),
        std::fs::read(step_dir(&base, steps).join(MODEL_FILE)).unwrap()
    );

    // Abort mid-epoch with step 12's save held in flight (it dies with the process), resume
    // from step 6, finish: every later checkpoint equals the uninterrupted run's.
    let dir = tmp.path().join("resumed");
    let out = train(
        &dir,
        &[
            ("steps", s(steps)),
            ("abort_at", s(13)),
            ("slow_persist_ms", s(3000)),
            wgpu.clone(),
        ],
    );
    assert!(!out.status.success(), "the run did not abort");
    assert!(
        !step_dir(&dir, 12).exists(),
        "step 12 should have died in flight"
    );
    let report = train_ok(&dir, &[("steps", s(steps)), ("resume", s(1)), wgpu.clone()]);
    assert_eq!(report["start_step"].as_u64(), Some(6));
    for st in [12, 18] {
        assert_same_files(&step_dir(&base, st), &step_dir(&dir, st));
    }

    // Immutability: persists slowed down so the trainer runs several steps past each snapshot
    // before its records are read from the device.
    let a = tmp.path().join("async-held");
    let b = tmp.path().join("sync");
    let init = step_dir(&base, 6).display().to_string();
    let ra = train_ok(
        &a,
        &[
            ("steps", s(steps)),
            ("init_from", init.clone()),
            ("hold_ms", s(600)),
            // Updates copy on write while the snapshot holds the state: the held handles
            // alone keep the step's values.
            ("update_wait", s("never")),
            ("optimizer_read", s("background")),
            wgpu.clone(),
        ],
    );
    // With the optimizer read on the staging helper, updates wait for the staging by default
    // on a device backend: no update runs with state held (the GPU-shaped snapshot), and the
    // bytes are the same.
    let w = tmp.path().join("async-waited");
    let rw = train_ok(
        &w,
        &[
            ("steps", s(steps)),
            ("init_from", init.clone()),
            ("hold_ms", s(600)),
            ("optimizer_read", s("background")),
            wgpu.clone(),
        ],
    );
    let samples = rw["pinned_at_next_update"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{samples:?}");
    for sample in samples {
        assert_eq!(
            sample["bytes"], 0,
            "an update ran with state held: {sample}"
        );
        assert!(sample["update_wait_ms"].as_f64().unwrap() > 0.0, "{sample}");
    }
    let held = ra["pinned_at_next_update"].as_array().unwrap();
    assert!(
        held.iter().any(|x| x["bytes"].as_u64().unwrap() > 0),
        "the run without the wait never held state at an update: {held:?}"
    );
    // By default on wgpu (one queue) the save call reads the optimizer's state itself and the
    // model's read is enqueued there too: even with no wait and the staging held back, no
    // update runs with state held, and the bytes are the same.
    let c = tmp.path().join("async-read-at-capture");
    let rc = train_ok(
        &c,
        &[
            ("steps", s(steps)),
            ("init_from", init.clone()),
            ("hold_ms", s(600)),
            ("update_wait", s("never")),
            wgpu.clone(),
        ],
    );
    assert_eq!(rc["optimizer_read"], "at-capture");
    assert_eq!(ra["optimizer_read"], "background");
    let samples = rc["pinned_at_next_update"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{samples:?}");
    for sample in samples {
        assert_eq!(
            sample["bytes"], 0,
            "an update ran with state held although the save call read it: {sample}"
        );
    }
    train_ok(
        &b,
        &[
            ("steps", s(steps)),
            ("init_from", init),
            ("mode", s("sync")),
            wgpu,
        ],
    );
    assert_eq!(ra["saves"].as_array().unwrap().len(), 3);
    for st in [6, 12, 18] {
        assert_same_files(&step_dir(&a, st), &step_dir(&b, st));
        assert_same_files(&step_dir(&w, st), &step_dir(&b, st));
        assert_same_files(&step_dir(&c, st), &step_dir(&b, st));
    }
}
