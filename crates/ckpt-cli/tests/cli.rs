//! The `ckpt` command end to end: ls, verify (whole root and one checkpoint), gc, bad input.

mod common;

use common::ckpt;
use std::{fs, path::Path};

use ckpt_core::{Engine, EngineConfig, Snapshot};
use test_support::fs::{At, flip_byte};

fn make_root(root: &Path, steps: &[u64]) {
    let (mut e, _) = Engine::open(EngineConfig::new(root)).unwrap();
    for &s in steps {
        e.submit(
            Snapshot::new(s)
                .with_epoch(1)
                .with_bytes("model.bpk", vec![s as u8; 300])
                .with_bytes("trainer.bin", vec![1, 2, 3]),
        )
        .unwrap();
    }
    e.finish().unwrap();
}

#[test]
fn ls_verify_gc() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let r = root.to_str().unwrap();
    make_root(root, &[10, 20, 30]);

    let (code, out, _) = ckpt(&["ls", r]);
    assert_eq!(code, 0);
    assert!(
        out.contains("step-00000030") && out.contains("ok (latest)"),
        "{out}"
    );
    let (code, out, _) = ckpt(&["ls", r, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3);
    assert_eq!(v[2]["step"], 30);
    assert_eq!(v[2]["latest"], true);

    let (code, out, _) = ckpt(&["verify", r]);
    assert_eq!(code, 0, "{out}");
    let (code, _, _) = ckpt(&["verify", root.join("step-00000020").to_str().unwrap()]);
    assert_eq!(code, 0);

    // Corrupt one byte of step 20's model: verify names the file and fails, for the root and
    // for the checkpoint.
    flip_byte(&root.join("step-00000020/model.bpk"), At::Offset(7), 1);
    let (code, _, err) = ckpt(&["verify", r]);
    assert_eq!(code, 1);
    assert!(
        err.contains("step-00000020/model.bpk") && err.contains("checksum mismatch"),
        "{err}"
    );
    let (code, _, err) = ckpt(&["verify", root.join("step-00000020").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("model.bpk"), "{err}");

    // gc removes the invalid checkpoint and stale tmp data, then retention keeps one.
    fs::create_dir(root.join(".tmp-99-stale")).unwrap();
    let (code, out, err) = ckpt(&["gc", r, "--keep-last", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(".tmp-99-stale") && out.contains("step-00000020"),
        "{out}"
    );
    assert!(!root.join("step-00000010").exists() && root.join("step-00000030").exists());
    let (code, _, _) = ckpt(&["verify", r]);
    assert_eq!(code, 0);
}

#[test]
fn gc_refuses_while_a_writer_holds_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let (_e, _) = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let (code, _, err) = ckpt(&["gc", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("locked by another writer"), "{err}");
}

#[test]
fn bad_input_gives_clear_errors() {
    let (code, _, err) = ckpt(&["ls", "/nonexistent/root"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/root: not a directory"), "{err}");
    let (code, _, _) = ckpt(&["frobnicate"]);
    assert_eq!(code, 2);
    let dir = tempfile::tempdir().unwrap();
    make_root(dir.path(), &[1]);
    fs::write(dir.path().join("latest"), "step-00000099\n").unwrap();
    let (code, _, err) = ckpt(&["verify", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("latest") && err.contains("step-00000099"),
        "{err}"
    );
    fs::write(
        dir.path().join("step-00000001/manifest.json"),
        b"{ not json",
    )
    .unwrap();
    let (code, _, err) = ckpt(&["verify", dir.path().join("step-00000001").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("manifest.json"), "{err}");
}

#[test]
fn ls_tells_epoch_keyed_checkpoints_from_step_keyed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (mut e, _) = Engine::open(EngineConfig::new(root)).unwrap();
    // Burn's epoch loop through `CkptCheckpointers`: the key is epoch 2.
    e.submit(
        Snapshot::new(2)
            .with_epoch(2)
            .with_meta(ckpt_core::Manifest::CHECKPOINT_KEY, "epoch")
            .with_bytes("model.bpk", vec![1; 10]),
    )
    .unwrap();
    e.submit(
        Snapshot::new(40)
            .with_epoch(3)
            .with_bytes("model.bpk", vec![2; 10]),
    )
    .unwrap();
    e.finish().unwrap();
    let r = root.to_str().unwrap();
    let (code, out, _) = ckpt(&["ls", r]);
    assert_eq!(code, 0);
    let row = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{out}"))
            .to_string()
    };
    let epoch_row = row("step-00000002");
    assert!(
        epoch_row.split_whitespace().nth(1) == Some("-") && epoch_row.contains("keyed by epoch"),
        "{epoch_row}"
    );
    let step_row = row("step-00000040");
    assert!(
        step_row.split_whitespace().nth(1) == Some("40") && !step_row.contains("epoch"),
        "{step_row}"
    );
    let (_, out, _) = ckpt(&["ls", r, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["step"], serde_json::Value::Null);
    assert_eq!(v[0]["keyed_by"], "epoch");
    assert_eq!(v[0]["epoch"], 2);
    assert_eq!(v[1]["step"], 40);
    assert_eq!(v[1]["keyed_by"], "step");
}

#[test]
fn a_reader_that_closes_early_ends_ckpt_quietly() {
    let dir = tempfile::tempdir().unwrap();
    make_root(dir.path(), &[10, 20, 30]);
    // `ckpt ls ROOT --json | head -0`: the reading end is closed before ckpt writes.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(["ls", dir.path().to_str().unwrap(), "--json"])
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked"),
        "ckpt panicked on a closed pipe: {err}"
    );
}

#[test]
fn ls_shows_what_rewinds_moved_aside_and_gc_removes_it_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let r = root.to_str().unwrap();
    make_root(root, &[10, 20, 30]);
    // A run that resumed from step 10: 20 and 30 belong to the abandoned timeline.
    let (mut e, _) = Engine::open(EngineConfig::new(root)).unwrap();
    let moved = e.rewind(Some(10)).unwrap();
    assert_eq!(moved.len(), 2);
    e.finish().unwrap();
    let aside = test_support::fs::rewound_entries(root);
    assert_eq!(aside.len(), 2, "{aside:?}");

    let (code, out, _) = ckpt(&["ls", r]);
    assert_eq!(code, 0);
    assert!(
        out.contains("step-00000010") && !out.contains("step-00000030"),
        "{out}"
    );
    assert!(
        out.contains("2 checkpoint(s) a rewind moved aside") && out.contains("gc --rewound"),
        "ls must say what the rewound entries hold: {out}"
    );
    // JSON stays one document on stdout; the note goes to stderr.
    let (code, out, err) = ckpt(&["ls", r, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert!(err.contains("rewind moved aside"), "{err}");

    // A plain gc keeps them and says so.
    let (code, out, err) = ckpt(&["gc", r]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("are kept"), "{out}");
    assert_eq!(test_support::fs::rewound_entries(root).len(), 2);

    // An object-store prefix has none: asking is an error, not a silent no-op.
    let (code, _, err) = ckpt(&["gc", "s3://bucket/prefix", "--rewound"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--rewound") && err.contains("object-store"),
        "{err}"
    );

    // --rewound removes them and nothing else.
    let (code, out, err) = ckpt(&["gc", r, "--rewound"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("(rewound)").count(), 2, "{out}");
    assert!(test_support::fs::rewound_entries(root).is_empty());
    assert!(root.join("step-00000010").exists());
    let (code, out, _) = ckpt(&["ls", r]);
    assert_eq!(code, 0);
    assert!(!out.contains("rewind"), "{out}");
    let (code, _, _) = ckpt(&["verify", r]);
    assert_eq!(code, 0);
}

/// Pointed at a directory with no checkpoints of its own, `ls` says so and names the roots
/// below it (a run's directory one level too high; a memory tier's node directory, whose parts
/// are roots two levels down), and `verify` fails rather than verify nothing.
#[test]
fn a_directory_above_the_roots_names_them_and_verifies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("runs/x");
    make_root(&run.join("ckpt"), &[10, 20]);
    let node = dir.path().join("node-0");
    make_root(&node.join("run-ab12/rank-0-of-2"), &[5]);
    make_root(&node.join("run-ab12/replica-1-of-2"), &[5]);
    fs::create_dir_all(dir.path().join("empty")).unwrap();

    let (code, out, _) = ckpt(&["ls", run.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no checkpoints in"), "{out}");
    assert!(out.contains("runs/x/ckpt (2)"), "{out}");
    let (code, out, _) = ckpt(&["ls", node.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("run-ab12/rank-0-of-2 (1)") && out.contains("run-ab12/replica-1-of-2 (1)"),
        "{out}"
    );
    // With --json stdout stays one (empty) JSON document; the note goes to stderr.
    let (code, out, err) = ckpt(&["ls", node.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!([])
    );
    assert!(err.contains("rank-0-of-2 (1)"), "{err}");

    let (code, out, err) = ckpt(&["verify", run.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("nothing to verify") && err.contains("runs/x/ckpt (2)"),
        "{err}"
    );
    let (code, _, err) = ckpt(&["verify", dir.path().join("empty").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no checkpoints in") && err.contains("nothing to verify"),
        "{err}"
    );
    assert!(!err.contains("below"), "{err}");
    // The root itself still verifies.
    let (code, out, _) = ckpt(&["verify", run.join("ckpt").to_str().unwrap()]);
    assert_eq!(
        (code, out.contains("2 checkpoint(s) verified")),
        (0, true),
        "{out}"
    );
}
