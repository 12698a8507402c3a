//! (b) Real crashes: a child process aborts (`std::process::abort`) at each failpoint of the
//! publication protocol; a new engine on the same root then recovers, removes `.tmp-*`, and
//! reports the newest valid checkpoint.

use std::{fs, path::Path, process::Command};

use ckpt_core::{Engine, EngineConfig, Retention, Snapshot, failpoints, read_latest, verify_root};
use test_support::fs::tmp_entries;

const ROOT_VAR: &str = "CKPT_TEST_CRASH_ROOT";
const POINT_VAR: &str = "CKPT_TEST_CRASH_AT";

fn snap(step: u64) -> Snapshot {
    Snapshot::new(step)
        .with_bytes("model.bin", vec![step as u8; 1 << 16])
        .with_bytes("optim.bin", vec![!(step as u8); 1 << 16])
}

fn config(root: &Path) -> EngineConfig {
    EngineConfig::new(root).retention(Retention::keep_last(1))
}

/// The child's body; a no-op unless run by `crash_at_every_failpoint_then_recover`.
#[test]
fn crash_child() {
    let (Ok(root), Ok(point)) = (std::env::var(ROOT_VAR), std::env::var(POINT_VAR)) else {
        return;
    };
    let (mut e, _) = Engine::open(config(Path::new(&root))).unwrap();
    e.submit(snap(1)).unwrap();
    e.wait_idle().unwrap();
    let name: &'static str = failpoints::ALL.iter().find(|p| **p == point).unwrap();
    fail::cfg_callback(name, || std::process::abort()).unwrap();
    e.submit(snap(2)).unwrap();
    let _ = e.wait_idle();
    // Reaching this line means the failpoint never fired.
    std::process::exit(3);
}

#[test]
fn crash_at_every_failpoint_then_recover() {
    for point in failpoints::ALL {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let status = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(ROOT_VAR, root)
            .env(POINT_VAR, point)
            .output()
            .unwrap();
        assert!(
            !status.status.success() && status.status.code() != Some(3),
            "{point}: child did not crash: {status:?}"
        );
        let had_tmp = fs::read_dir(root)
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".tmp"));
        // Step 2 survives exactly when the crash came after its directory was renamed into place.
        let after_rename = matches!(
            *point,
            failpoints::FSYNC_ROOT
                | failpoints::WRITE_LATEST
                | failpoints::RENAME_LATEST
                | failpoints::RETENTION
        );
        let want = if after_rename { 2 } else { 1 };
        let (e, report) = Engine::open(config(root)).unwrap();
        assert_eq!(
            report.latest.as_ref().map(|c| c.step),
            Some(want),
            "{point}: {report:?}"
        );
        assert_eq!(!report.removed_tmp.is_empty(), had_tmp, "{point}");
        assert!(tmp_entries(root).is_empty());
        assert_eq!(
            read_latest(root).unwrap(),
            Some(format!("step-{want:08}")),
            "{point}"
        );
        verify_root(root).unwrap();
        drop(e);
    }
}
