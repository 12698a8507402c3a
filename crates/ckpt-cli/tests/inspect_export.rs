//! `ckpt inspect` and `ckpt export` end to end on a real checkpoint written by the project's
//! trainer (`ckpt_demo::run`): JSON and table output, safetensors content against the
//! burnpack source, interop with Python's `safetensors` package, and bad input.

mod common;

use common::ckpt;
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use ckpt_demo::{self as demo, DemoConfig, Frequency};
use test_support::fs::{At, flip_byte};

const STEPS: u64 = 3;
const SEED: u64 = 11;
const HIDDEN: usize = 8;

/// One real checkpoint (step 3 of a tiny run), trained once per test process.
fn checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("inspect-export-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let mut cfg = DemoConfig::new(&root);
        cfg.seed = SEED;
        cfg.steps = STEPS;
        cfg.hidden = HIDDEN;
        cfg.layers = 1;
        cfg.batch_size = 4;
        cfg.dataset_size = 10;
        cfg.keep_last = None;
        cfg.frequency = Frequency::EverySteps(STEPS);
        demo::run(&cfg, &mut |_| {}).unwrap();
        root.join("step-00000003")
    })
}

fn inspect_json(dir: &Path) -> serde_json::Value {
    let (code, out, err) = ckpt(&["inspect", dir.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn file<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["file"] == name)
        .unwrap_or_else(|| panic!("{name} not in {v}"))
}

#[test]
fn inspect_json_reports_tensors_scalars_and_trainer_state() {
    let dir = checkpoint();
    let v = inspect_json(dir);
    assert_eq!(v["step"], STEPS);
    assert_eq!(v["trainer"]["step"], STEPS);
    assert_eq!(v["trainer"]["base_seed"], SEED);
    // 10 samples in batches of 4: three steps read 12 items, so the cursor is in epoch 1.
    assert_eq!(v["trainer"]["cursor"]["epoch"], v["trainer"]["epoch"]);
    assert!(v["trainer"]["cursor"]["position"].is_u64());

    let model = file(&v, "model.bpk");
    let names: Vec<&str> = model["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "head.bias",
            "head.weight",
            "layers.0.bias",
            "layers.0.weight"
        ]
    );
    let w = &model["tensors"][3];
    assert_eq!(w["dtype"], "F32");
    assert_eq!(w["shape"], serde_json::json!([16, HIDDEN]));
    assert_eq!(w["bytes"], 16 * HIDDEN * 4);
    assert_eq!(w["leading"].as_array().unwrap().len(), 8);

    // The leading values are the file's: compare with a direct burnpack read.
    let reader = burn_pack::Reader::from_file(dir.join("model.bpk")).unwrap();
    let raw = reader.tensor_data("layers.0.weight").unwrap();
    for (i, l) in w["leading"].as_array().unwrap().iter().enumerate() {
        let x = f32::from_le_bytes(raw[i * 4..i * 4 + 4].try_into().unwrap());
        // serde_json's default float parsing may be one ulp off in f64; exact in f32.
        assert_eq!(l.as_f64().unwrap() as f32, x);
    }

    // The optimizer has tensors (AdamW moments) and the scheduler scalars only.
    let optim = file(&v, "optim.bpk");
    assert!(!optim["tensors"].as_array().unwrap().is_empty());
    let sched = file(&v, "scheduler.bpk");
    assert!(sched["tensors"].as_array().unwrap().is_empty());
    assert!(
        !sched["scalars"].as_object().unwrap().is_empty() || !sched["metadata"].is_null(),
        "{sched}"
    );
}

#[test]
fn inspect_table_is_readable() {
    let dir = checkpoint();
    let (code, out, err) = ckpt(&["inspect", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("step 3"), "{out}");
    assert!(out.contains("trainer: step 3"), "{out}");
    assert!(out.contains("data cursor epoch"), "{out}");
    assert!(
        out.contains("layers.0.weight") && out.contains("[16, 8]"),
        "{out}"
    );
    assert!(
        out.contains("optim.bpk") && out.contains("scheduler.bpk"),
        "{out}"
    );
}

#[test]
fn export_safetensors_holds_every_model_tensor() {
    let dir = checkpoint();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("model.safetensors");
    let (code, stdout, err) = ckpt(&[
        "export",
        dir.to_str().unwrap(),
        "--to",
        "safetensors",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("wrote 4 tensors"), "{stdout}");

    let bytes = fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let reader = burn_pack::Reader::from_file(dir.join("model.bpk")).unwrap();
    let mut names: Vec<&str> = st.names();
    names.sort();
    assert_eq!(names, reader.tensor_names());
    for name in reader.tensor_names() {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
        assert_eq!(
            t.data(),
            reader.tensor_data(name).unwrap().as_slice(),
            "{name}"
        );
    }
    assert_eq!(st.tensor("layers.0.weight").unwrap().shape(), &[16, HIDDEN]);
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["step"], "3");

    // With the optimizer: its tensors under `optim.`, the model's unchanged.
    let out2 = tmp.path().join("all.safetensors");
    let (code, _, err) = ckpt(&[
        "export",
        dir.to_str().unwrap(),
        "--to",
        "safetensors",
        out2.to_str().unwrap(),
        "--with-optim",
    ]);
    assert_eq!(code, 0, "{err}");
    let bytes2 = fs::read(&out2).unwrap();
    let st2 = safetensors::SafeTensors::deserialize(&bytes2).unwrap();
    let optim = burn_pack::Reader::from_file(dir.join("optim.bpk")).unwrap();
    assert_eq!(st2.len(), 4 + optim.tensor_names().len());
    for name in optim.tensor_names() {
        let t = st2.tensor(&format!("optim.{name}")).unwrap();
        assert_eq!(t.data(), optim.tensor_data(name).unwrap().as_slice());
    }
    assert_eq!(
        st2.tensor("head.weight").unwrap().data(),
        st.tensor("head.weight").unwrap().data()
    );
}

#[test]
fn exporting_a_checkpoint_again_gives_the_same_bytes() {
    // Each export is its own process, so a map's per-process order would show (safetensors
    // writes the metadata from a `HashMap`): four runs all alike by chance is 1 in 24^3.
    let dir = checkpoint();
    let tmp = tempfile::tempdir().unwrap();
    let exports: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let out = tmp.path().join(format!("model-{i}.safetensors"));
            let (code, _, err) = ckpt(&[
                "export",
                dir.to_str().unwrap(),
                "--to",
                "safetensors",
                out.to_str().unwrap(),
                "--with-optim",
            ]);
            assert_eq!(code, 0, "{err}");
            assert!(!err.contains("WARN"), "{err}");
            fs::read(&out).unwrap()
        })
        .collect();
    for (i, e) in exports.iter().enumerate().skip(1) {
        assert!(e == &exports[0], "export {i} differs from export 0");
    }
    let (_, meta) = safetensors::SafeTensors::read_metadata(&exports[0]).unwrap();
    let meta = meta.metadata().as_ref().unwrap();
    assert_eq!(
        (meta["format"].as_str(), meta["step"].as_str(), meta.len()),
        ("pt", "3", 4)
    );
    let header_len = u64::from_le_bytes(exports[0][..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&exports[0][8..8 + header_len]).unwrap();
    assert!(
        header.starts_with(
            r#"{"__metadata__":{"epoch":"0","format":"pt","source":"burn-ckpt","step":"3"}"#
        ),
        "{header}"
    );
}

/// Copies the shared checkpoint so a test can damage it.
fn copy_of(dir: &Path, into: &Path) -> PathBuf {
    let dst = into.join("step-00000003");
    fs::create_dir(&dst).unwrap();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

#[test]
fn bad_input_gives_one_line_errors_naming_the_file() {
    let (code, _, err) = ckpt(&["inspect", "/nonexistent/step-00000001"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("/nonexistent/step-00000001: not a directory"),
        "{err}"
    );
    let (code, _, err) = ckpt(&[
        "export",
        "/nonexistent/step-00000001",
        "--to",
        "safetensors",
        "/tmp/x.safetensors",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/step-00000001"), "{err}");
    // Usage errors: no format, unknown format.
    let (code, _, _) = ckpt(&["export", "/tmp", "/tmp/x.safetensors"]);
    assert_eq!(code, 2);
    let (code, _, _) = ckpt(&["export", "/tmp", "--to", "onnx", "/tmp/x"]);
    assert_eq!(code, 2);

    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_of(checkpoint(), tmp.path());
    let d = dir.to_str().unwrap();

    // Unwritable output: names the output, leaves nothing behind.
    let out = tmp.path().join("no/such/dir/m.safetensors");
    let (code, _, err) = ckpt(&["export", d, "--to", "safetensors", out.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("m.safetensors"), "{err}");

    // One flipped byte in model.bpk: both commands fail on the checksum, naming the file.
    flip_byte(&dir.join("model.bpk"), At::FromEnd(3), 0x40);
    let out = tmp.path().join("m.safetensors");
    for args in [
        vec!["inspect", d],
        vec!["inspect", d, "--json"],
        vec!["export", d, "--to", "safetensors", out.to_str().unwrap()],
    ] {
        let (code, stdout, err) = ckpt(&args);
        assert_eq!(code, 1, "{args:?}: {stdout}");
        assert!(
            err.contains("model.bpk") && err.contains("checksum mismatch"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    assert!(!out.exists());

    // A burnpack file that is garbage but matches its manifest (re-published): a parse error
    // naming the file, not a panic.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut e = ckpt_core::Engine::open(ckpt_core::EngineConfig::new(tmp2.path()))
        .unwrap()
        .0;
    e.submit(ckpt_core::Snapshot::new(1).with_bytes("model.bpk", vec![7u8; 100]))
        .unwrap();
    e.finish().unwrap();
    let bad = tmp2.path().join("step-00000001");
    let (code, _, err) = ckpt(&["inspect", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("model.bpk") && err.contains("burnpack"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn python_safetensors_reads_the_export() {
    let ok = Command::new("python3")
        .args(["-c", "import safetensors, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        println!("SKIP: python safetensors/numpy not installed");
        return;
    }
    let dir = checkpoint();
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("inspect.json");
    let (code, out, err) = ckpt(&["inspect", dir.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    fs::write(&json, out).unwrap();
    for with_optim in [false, true] {
        let st = tmp.path().join(format!("export-{with_optim}.safetensors"));
        let mut args = vec![
            "export",
            dir.to_str().unwrap(),
            "--to",
            "safetensors",
            st.to_str().unwrap(),
        ];
        if with_optim {
            args.push("--with-optim");
        }
        let (code, _, err) = ckpt(&args);
        assert_eq!(code, 0, "{err}");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_export.py");
        let mut cmd = Command::new("python3");
        cmd.arg(&script).arg(&st).arg(&json);
        if with_optim {
            cmd.arg("--with-optim");
        }
        let o = cmd.output().unwrap();
        assert!(
            o.status.success(),
            "check_export.py failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
