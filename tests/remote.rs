//! The object-store tier through the example trainer (`--upload-to`, feature `remote`),
//! against a real S3-compatible server (`moto_server`) on loopback: every published checkpoint
//! is uploaded; with the local root deleted, `--resume` restores from the object store and the
//! run finishes byte-identical to an uninterrupted one.
#![cfg(feature = "remote")]

mod common;

use std::time::Duration;

use common::*;
use test_support::s3::{BUCKET, Moto, s3_env};

#[test]
fn child_entry() {
    common::child_entry();
}

const STEPS: u64 = 36;

/// Runs trainer `t` with the S3 environment of `endpoint`; returns its exit code and stderr.
fn run_with_s3(t: &Trainer, endpoint: &str) -> (Option<i32>, String) {
    let out = t.command().envs(s3_env(endpoint)).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn upload_then_resume_from_the_object_store_matches_the_uninterrupted_run() {
    let moto = Moto::start();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    trainer(&base).steps(STEPS).save_every(6).run_ok();

    // The first half, uploading every checkpoint; keep 2 locally and remotely.
    let url = format!("s3://{BUCKET}/run-1");
    let dir = tmp.path().join("run");
    let first = trainer(&dir)
        .steps(18)
        .save_every(6)
        .arg("--keep-last", 2)
        .arg("--upload-to", &url);
    let (code, stderr) = run_with_s3(&first, &moto.endpoint());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("uploaded 3 checkpoints"), "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");

    // The node is lost: no local checkpoint at all.
    std::fs::remove_dir_all(&dir).unwrap();
    let second = trainer(&dir)
        .steps(STEPS)
        .save_every(6)
        .arg("--keep-last", 2)
        .arg("--upload-to", &url)
        .flag("--resume");
    let (code, stderr) = run_with_s3(&second, &moto.endpoint());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("resumed from step 18")
            && stderr.contains(&format!("downloaded from {url}/step-00000018")),
        "the trainer says it resumed from the remote copy: {stderr}"
    );
    assert_same_checkpoint(&step_dir(&base, STEPS), &step_dir(&dir, STEPS));

    // The remote prefix verifies, and its newest checkpoint equals the local one.
    let remote = ckpt_demo::remote::Remote::open(
        &url,
        ckpt_demo::remote::RemoteConfig {
            store_options: test_support::s3::store_options(&moto.endpoint()),
            retry_timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .unwrap();
    let steps: Vec<u64> = remote.list().unwrap().iter().map(|c| c.step).collect();
    assert_eq!(steps, [30, 36], "remote retention keeps 2");
    assert_eq!(remote.latest().unwrap().as_deref(), Some("step-00000036"));
    for f in FILES {
        assert_eq!(
            remote.read_part(STEPS, f).unwrap(),
            std::fs::read(step_dir(&dir, STEPS).join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn an_unreachable_object_store_stops_the_trainer_naming_the_step_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // Nothing listens on this port: every request fails (after the bounded retries).
    let endpoint = format!("http://127.0.0.1:{}", test_support::s3::free_port());
    let url = format!("s3://{BUCKET}/run-down");
    let t = trainer(&dir)
        .steps(12)
        .save_every(6)
        .arg("--upload-to", &url);
    let (code, stderr) = run_with_s3(&t, &endpoint);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("uploading step 6") && stderr.contains("run-down/step-00000006/"),
        "one line naming the step and the object key: {stderr}"
    );
    // The local checkpoint was published before the upload; it is intact.
    burn_ckpt::ckpt_core::verify_checkpoint(&step_dir(&dir, 6)).unwrap();
}
