//! Injected I/O errors at every step of the publication protocol, and backpressure under a
//! slow persist. Every test holds a `FailScenario`, which serializes them (failpoints are
//! process-global).

use std::time::Duration;

use ckpt_core::{
    Backpressure, Engine, EngineConfig, Error, Retention, Snapshot, Stage, engine::SubmitOutcome,
    failpoints, read_latest, verify_root,
};
use fail::FailScenario;
use test_support::fs::tmp_entries;

fn snap(step: u64) -> Snapshot {
    Snapshot::new(step)
        .with_bytes("model.bin", vec![step as u8; 4096])
        .with_producer("trainer.bin", move |w: &mut dyn std::io::Write| {
            w.write_all(&step.to_le_bytes())?;
            Ok(())
        })
}

fn expected_stage(fp: &str) -> Option<Stage> {
    Some(match fp {
        failpoints::WRITE_PART => Stage::WritePart,
        failpoints::FSYNC_PART => Stage::FsyncPart,
        failpoints::WRITE_MANIFEST => Stage::WriteManifest,
        failpoints::FSYNC_MANIFEST => Stage::FsyncManifest,
        failpoints::FSYNC_TMP_DIR => Stage::FsyncTmpDir,
        failpoints::RENAME => Stage::Rename,
        failpoints::FSYNC_ROOT => Stage::FsyncRoot,
        failpoints::WRITE_LATEST | failpoints::RENAME_LATEST => Stage::UpdateLatest,
        _ => return None,
    })
}

/// (a) An injected I/O error at each failpoint comes back typed, naming the step, from the next
/// `poll`, `submit` or `finish`; nothing is published for that step; `latest` still names the
/// previous checkpoint; temporary data is cleaned up; the next checkpoint succeeds.
#[test]
fn injected_error_at_every_failpoint_is_reported_and_publishes_nothing() {
    let scenario = FailScenario::setup();
    for (i, fp) in failpoints::ALL.iter().copied().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let cfg = EngineConfig::new(root).retention(Retention::keep_last(1));
        let (mut e, _) = Engine::open(cfg).unwrap();
        e.submit(snap(1)).unwrap();
        e.wait_idle().unwrap();
        fail::cfg(fp, "1*return").unwrap();
        e.submit(snap(2)).unwrap();
        while e.in_flight() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Rotate which call surfaces the error.
        let (err, e) = match i % 3 {
            0 => (e.poll().unwrap_err(), Some(e)),
            1 => (e.submit(snap(3)).unwrap_err(), Some(e)),
            _ => (e.finish().unwrap_err(), None),
        };
        fail::remove(fp);
        assert_eq!(err.step(), Some(2), "{fp}: {err}");
        assert!(
            err.to_string().contains("step 2"),
            "{fp}: message does not name the step: {err}"
        );
        match expected_stage(fp) {
            Some(stage) => {
                assert!(
                    matches!(&err, Error::Persist { stage: s, .. } if *s == stage),
                    "{fp}: {err:?}"
                );
                assert!(
                    !root.join("step-00000002").exists(),
                    "{fp}: step 2 was published"
                );
                assert_eq!(
                    read_latest(root).unwrap().as_deref(),
                    Some("step-00000001"),
                    "{fp}"
                );
            }
            None => {
                // Retention runs after publication: step 2 is published, step 1 survives.
                assert!(
                    matches!(err, Error::Retention { step: 2, .. }),
                    "{fp}: {err:?}"
                );
                assert_eq!(read_latest(root).unwrap().as_deref(), Some("step-00000002"));
            }
        }
        assert_eq!(
            tmp_entries(root),
            Vec::<String>::new(),
            "{fp}: temporary data left behind"
        );
        verify_root(root).unwrap();
        // The engine keeps working afterwards.
        let mut e = match e {
            Some(e) => e,
            None => {
                Engine::open(EngineConfig::new(root).retention(Retention::keep_last(1)))
                    .unwrap()
                    .0
            }
        };
        e.submit(snap(4)).unwrap();
        e.finish().unwrap();
        assert_eq!(
            read_latest(root).unwrap().as_deref(),
            Some("step-00000004"),
            "{fp}"
        );
        verify_root(root).unwrap();
    }
    scenario.teardown();
}

#[test]
fn enospc_and_eio_keep_their_os_error() {
    let scenario = FailScenario::setup();
    for (arg, code) in [("enospc", 28), ("eio", 5)] {
        let dir = tempfile::tempdir().unwrap();
        let (mut e, _) = Engine::open(EngineConfig::new(dir.path())).unwrap();
        fail::cfg(failpoints::WRITE_PART, &format!("1*return({arg})")).unwrap();
        e.submit(snap(7)).unwrap();
        let err = e.finish().unwrap_err();
        fail::remove(failpoints::WRITE_PART);
        match err {
            Error::Persist {
                step: 7,
                stage: Stage::WritePart,
                ref path,
                ref source,
            } => {
                assert_eq!(source.raw_os_error(), Some(code));
                assert!(path.ends_with("model.bin"), "{}", path.display());
            }
            other => panic!("{other:?}"),
        }
        assert!(read_latest(dir.path()).unwrap().is_none());
        assert!(tmp_entries(dir.path()).is_empty());
    }
    scenario.teardown();
}

/// A persist slower than the submit rate: `Block` waits for the slot (the previous checkpoint
/// is published when submit returns), `Skip` drops and counts, `Sync` writes inline.
#[test]
fn backpressure_policies_under_a_slow_persist() {
    let scenario = FailScenario::setup();
    fail::cfg(failpoints::WRITE_PART, "sleep(300)").unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (mut e, _) = Engine::open(EngineConfig::new(dir.path())).unwrap();
    e.submit(snap(1)).unwrap();
    match e.submit(snap(2)).unwrap() {
        SubmitOutcome::Queued { blocked, .. } => {
            assert!(blocked > Duration::ZERO);
            assert!(
                dir.path().join("step-00000001").exists(),
                "slot freed before publication"
            );
        }
        o => panic!("{o:?}"),
    }
    assert!(e.metrics().blocked_total > Duration::ZERO);
    e.finish().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig::new(dir.path()).backpressure(Backpressure::Skip);
    let (mut e, _) = Engine::open(cfg).unwrap();
    e.submit(snap(1)).unwrap();
    assert_eq!(
        e.submit(snap(2)).unwrap(),
        SubmitOutcome::Skipped { step: 2 }
    );
    assert_eq!(
        e.submit(snap(3)).unwrap(),
        SubmitOutcome::Skipped { step: 3 }
    );
    assert_eq!(e.metrics().skipped, 2);
    let s = e.finish().unwrap();
    assert_eq!(s.metrics.skipped, 2);
    assert!(!dir.path().join("step-00000002").exists());
    assert_eq!(
        read_latest(dir.path()).unwrap().as_deref(),
        Some("step-00000001")
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig::new(dir.path()).backpressure(Backpressure::Sync);
    let (mut e, _) = Engine::open(cfg).unwrap();
    e.submit(snap(1)).unwrap();
    match e.submit(snap(2)).unwrap() {
        SubmitOutcome::WrittenSync(ev) => {
            assert!(ev.sync && ev.step == 2);
            assert!(dir.path().join("step-00000002").exists());
            assert!(
                ev.stall >= ev.persist,
                "a sync write stalls the caller for the whole persist"
            );
        }
        o => panic!("{o:?}"),
    }
    e.finish().unwrap();
    // Step 1 published after step 2 must not move `latest` backwards.
    assert_eq!(
        read_latest(dir.path()).unwrap().as_deref(),
        Some("step-00000002")
    );
    verify_root(dir.path()).unwrap();

    fail::remove(failpoints::WRITE_PART);
    scenario.teardown();
}

/// A failed replacement keeps the checkpoint it was replacing, at the rename and after it.
#[test]
fn failed_replace_keeps_the_old_checkpoint() {
    let scenario = FailScenario::setup();
    for fp in [
        failpoints::WRITE_PART,
        failpoints::RENAME,
        failpoints::FSYNC_ROOT,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut e, _) = Engine::open(EngineConfig::new(dir.path())).unwrap();
        e.submit(snap(5)).unwrap();
        e.wait_idle().unwrap();
        let old = ckpt_core::read_part(&dir.path().join("step-00000005"), "model.bin").unwrap();
        fail::cfg(fp, "1*return").unwrap();
        let new = Snapshot::new(5)
            .with_bytes("model.bin", vec![0xee; 10])
            .with_replace(true);
        e.submit(new).unwrap();
        let err = e.finish().unwrap_err();
        fail::remove(fp);
        assert_eq!(err.step(), Some(5), "{fp}: {err}");
        let now = ckpt_core::read_part(&dir.path().join("step-00000005"), "model.bin").unwrap();
        assert_eq!(now, old, "{fp}: the old checkpoint was lost");
        assert!(tmp_entries(dir.path()).is_empty(), "{fp}");
        verify_root(dir.path()).unwrap();
    }
    scenario.teardown();
}
