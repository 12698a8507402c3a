//! `ckpt ls/verify/inspect/export/gc` on an object-store URL, against a real S3-compatible server
//! (`moto_server`) on loopback.

use std::{process::Command, time::Duration};

use ckpt_demo::{self as demo, DemoConfig, Frequency};
use ckpt_remote::{Remote, RemoteConfig};
use test_support::s3::{BUCKET, Moto, s3_env};

fn ckpt(endpoint: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(args)
        .envs(s3_env(endpoint))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn remote(url: &str, endpoint: &str) -> Remote {
    Remote::open(
        url,
        RemoteConfig {
            store_options: test_support::s3::store_options(endpoint),
            retry_timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn ls_verify_inspect_export_and_gc_accept_an_s3_url() {
    let moto = Moto::start();
    let ep = moto.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("run");
    let mut cfg = DemoConfig::new(&root);
    cfg.steps = 6;
    cfg.hidden = 8;
    cfg.layers = 1;
    cfg.batch_size = 4;
    cfg.dataset_size = 10;
    cfg.keep_last = None;
    cfg.frequency = Frequency::EverySteps(3);
    demo::run(&cfg, &mut |_| {}).unwrap();
    let url = format!("s3://{BUCKET}/cli");
    let r = remote(&url, &ep);
    for step in [3, 6] {
        r.upload(&root.join(format!("step-{step:08}"))).unwrap();
    }

    let (code, out, err) = ckpt(&ep, &["ls", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("step-00000003") && out.contains("ok (latest)"),
        "{out}"
    );
    let (code, out, err) = ckpt(&ep, &["ls", &url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[1]["step"], 6);
    assert_eq!(v[1]["latest"], true);

    let (code, out, err) = ckpt(&ep, &["verify", &url]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("2 checkpoint(s) verified"), "{out}");
    let one = format!("{url}/step-00000006");
    let (code, out, err) = ckpt(&ep, &["verify", &one]);
    assert_eq!(code, 0, "{out}{err}");
    // A prefix with no checkpoints verifies nothing: an error, not "0 verified".
    let empty = format!("s3://{BUCKET}/no-such-run");
    let (code, out, err) = ckpt(&ep, &["verify", &empty]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("no checkpoints in") && err.contains("nothing to verify"),
        "{out}{err}"
    );

    let (code, out, err) = ckpt(&ep, &["inspect", &one, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trainer"]["step"], 6, "{v}");

    // Export from the store is the same file as from the local checkpoint it was uploaded from.
    let from_store = tmp.path().join("store.safetensors");
    let from_disk = tmp.path().join("disk.safetensors");
    let (code, out, err) = ckpt(
        &ep,
        &[
            "export",
            &one,
            "--to",
            "safetensors",
            from_store.to_str().unwrap(),
            "--with-optim",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote") && out.contains("tensors"), "{out}");
    let local = root.join("step-00000006");
    let (code, _, err) = ckpt(
        &ep,
        &[
            "export",
            local.to_str().unwrap(),
            "--to",
            "safetensors",
            from_disk.to_str().unwrap(),
            "--with-optim",
        ],
    );
    assert_eq!(code, 0, "{err}");
    // The same file, byte for byte (exports are reproducible), and so the same tensors.
    let (a, b) = (
        std::fs::read(&from_store).unwrap(),
        std::fs::read(&from_disk).unwrap(),
    );
    assert!(
        a == b,
        "the export from the store differs from the local one"
    );
    let (sa, sb) = (
        safetensors::SafeTensors::deserialize(&a).unwrap(),
        safetensors::SafeTensors::deserialize(&b).unwrap(),
    );
    let (_, ma) = safetensors::SafeTensors::read_metadata(&a).unwrap();
    let (_, mb) = safetensors::SafeTensors::read_metadata(&b).unwrap();
    assert_eq!(ma.metadata(), mb.metadata());
    let mut names = sa.names();
    names.sort();
    let mut names_b = sb.names();
    names_b.sort();
    assert_eq!(names, names_b);
    assert!(names.iter().any(|n| n.starts_with("optim.")), "{names:?}");
    for n in names {
        let (ta, tb) = (sa.tensor(n).unwrap(), sb.tensor(n).unwrap());
        assert_eq!(
            (ta.dtype(), ta.shape(), ta.data()),
            (tb.dtype(), tb.shape(), tb.data()),
            "{n}: the export from the store differs from the local one"
        );
    }
    let (code, _, err) = ckpt(
        &ep,
        &[
            "export",
            &url,
            "--to",
            "safetensors",
            from_store.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("name one checkpoint"), "{err}");

    // Retention on the remote prefix.
    let (code, out, err) = ckpt(&ep, &["gc", &url, "--keep-last", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed step 3 (retention)"), "{out}");
    let steps: Vec<u64> = r.list().unwrap().iter().map(|c| c.step).collect();
    assert_eq!(steps, [6]);

    // A bad URL is one clear line.
    let (code, _, err) = ckpt(&ep, &["ls", "ftp://nowhere/x"]);
    assert_eq!(code, 1);
    assert!(err.contains("unsupported scheme"), "{err}");
}
