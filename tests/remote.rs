//! The object-store tier through the example trainer (`--upload-to`, feature `remote`),
//! against a real S3-compatible server (`moto_server`) on loopback: every published checkpoint
//! is uploaded; with the local root deleted, `--resume` restores from the object store and the
//! run finishes byte-identical to an uninterrupted one. On ZeRO ranks (threads and `mpirun`)
//! every rank uploads its own optimizer shard and rank 0 publishes the remote checkpoint once
//! every part is up.
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

/// The remote prefix `url` on `moto`'s server, with short retries.
fn open_remote(url: &str, endpoint: &str) -> ckpt_demo::remote::Remote {
    ckpt_demo::remote::Remote::open(
        url,
        ckpt_demo::remote::RemoteConfig {
            store_options: test_support::s3::store_options(endpoint),
            retry_timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .unwrap()
}

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
    let remote = open_remote(&url, &moto.endpoint());
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

/// A 2-rank ZeRO trainer in `format`, saving every 6 steps, keeping 2 locally and remotely.
fn zero_trainer(dir: &std::path::Path, format: &str, steps: u64) -> Trainer {
    trainer(dir)
        .steps(steps)
        .save_every(6)
        .arg("--ranks", 2)
        .arg("--shard-format", format)
        .arg("--keep-last", 2)
}

#[test]
fn zero_ranks_upload_their_shards_and_resume_from_the_object_store() {
    let moto = Moto::start();
    let tmp = tempfile::tempdir().unwrap();
    for format in ["per-rank", "consolidated"] {
        let base = tmp.path().join(format!("base-{format}"));
        zero_trainer(&base, format, 24).run_ok();

        let url = format!("s3://{BUCKET}/zero-{format}");
        let dir = tmp.path().join(format!("run-{format}"));
        let first = zero_trainer(&dir, format, 12).arg("--upload-to", &url);
        let (code, stderr) = run_with_s3(&first, &moto.endpoint());
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stderr.contains("uploaded 2 checkpoints"), "{stderr}");

        // Published remotely with every rank's part, and it verifies.
        let remote = open_remote(&url, &moto.endpoint());
        let listed = remote.list().unwrap();
        let steps: Vec<u64> = listed.iter().map(|c| c.step).collect();
        assert_eq!(steps, [6, 12], "{format}");
        assert_eq!(remote.latest().unwrap().as_deref(), Some("step-00000012"));
        let m = remote.verify(12).unwrap();
        let mut names: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
        names.sort();
        let optim: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| n.starts_with("optim"))
            .collect();
        match format {
            "per-rank" => assert_eq!(optim, ["optim.rank-0-of-2.bpk", "optim.rank-1-of-2.bpk"]),
            _ => assert_eq!(optim, ["optim.bpk"]),
        }
        assert_eq!(m.world_size, 2);

        // The node is lost; the ranks resume from the object store.
        std::fs::remove_dir_all(&dir).unwrap();
        let second = zero_trainer(&dir, format, 24)
            .arg("--upload-to", &url)
            .flag("--resume");
        let (code, stderr) = run_with_s3(&second, &moto.endpoint());
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stderr.contains("resumed from step 12")
                && stderr.contains(&format!("downloaded from {url}/step-00000012")),
            "{stderr}"
        );
        assert_same_checkpoint(&step_dir(&base, 24), &step_dir(&dir, 24));
        for f in remote.verify(24).unwrap().files {
            assert_eq!(
                remote.read_part(24, &f.name).unwrap(),
                std::fs::read(step_dir(&dir, 24).join(&f.name)).unwrap(),
                "{format}: {}",
                f.name
            );
        }
    }
}

#[test]
fn a_rank_whose_shard_is_not_uploaded_publishes_nothing_remotely() {
    let moto = Moto::start();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let url = format!("s3://{BUCKET}/zero-skip");
    // Rank 1 claims its upload succeeded without uploading: rank 0 must not publish.
    let t = zero_trainer(&dir, "per-rank", 6)
        .arg("--upload-to", &url)
        .failpoint(ckpt_zero::upload::FP_SKIP_PART, "return(1)");
    let (code, stderr) = run_with_s3(&t, &moto.endpoint());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("uploading step 6")
            && stderr.contains("zero-skip/step-00000006/optim.rank-1-of-2.bpk"),
        "the error names the step and the missing part's key: {stderr}"
    );
    let remote = open_remote(&url, &moto.endpoint());
    assert_eq!(remote.latest().unwrap(), None);
    let listed = remote.list().unwrap();
    assert!(
        listed.iter().all(|c| c.manifest.is_none()),
        "no remote checkpoint exists: {listed:?}"
    );
    // The local checkpoint is published and intact.
    burn_ckpt::ckpt_core::verify_checkpoint(&step_dir(&dir, 6)).unwrap();

    // The next run uploads it whole (a retry of the same step) and goes on.
    let again = zero_trainer(&dir, "per-rank", 12)
        .arg("--upload-to", &url)
        .flag("--resume");
    let (code, stderr) = run_with_s3(&again, &moto.endpoint());
    assert_eq!(code, Some(0), "{stderr}");
    let valid: Vec<u64> = remote
        .list()
        .unwrap()
        .iter()
        .filter(|c| c.manifest.is_some())
        .map(|c| c.step)
        .collect();
    assert_eq!(valid, [12]);
    remote.verify(12).unwrap();
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_ranks_upload_their_own_shards() {
    let moto = Moto::start();
    let tmp = tempfile::tempdir().unwrap();
    let threads = tmp.path().join("threads");
    zero_trainer(&threads, "per-rank", 12).run_ok();
    let dir = tmp.path().join("mpi");
    let url = format!("s3://{BUCKET}/zero-mpi");
    let mut t = zero_trainer(&dir, "per-rank", 12)
        .arg("--dist", "mpi")
        .arg("--upload-to", &url);
    for (k, v) in s3_env(&moto.endpoint()) {
        t = t.env(k, v);
    }
    let Some(mut cmd) = t.mpirun_command(2) else {
        eprintln!("SKIP: mpirun not found (install openmpi-bin)");
        return;
    };
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let remote = open_remote(&url, &moto.endpoint());
    let m = remote.verify(12).unwrap();
    for f in &m.files {
        assert_eq!(
            remote.read_part(12, &f.name).unwrap(),
            std::fs::read(step_dir(&threads, 12).join(&f.name)).unwrap(),
            "{}",
            f.name
        );
    }
    assert!(m.file("optim.rank-1-of-2.bpk").is_some());
}

#[test]
fn zero_ranks_with_an_unreachable_store_stop_naming_the_step_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let endpoint = format!("http://127.0.0.1:{}", test_support::s3::free_port());
    let url = format!("s3://{BUCKET}/zero-down");
    let t = zero_trainer(&dir, "per-rank", 6).arg("--upload-to", &url);
    let (code, stderr) = run_with_s3(&t, &endpoint);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("uploading step 6") && stderr.contains("zero-down/step-00000006/"),
        "one line naming the step and the object key: {stderr}"
    );
    burn_ckpt::ckpt_core::verify_checkpoint(&step_dir(&dir, 6)).unwrap();
}
