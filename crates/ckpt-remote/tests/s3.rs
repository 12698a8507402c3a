//! The object-store tier against a real S3-compatible server (`moto_server`, started and
//! stopped by each test on loopback): round trip, multipart, the server killed mid-upload,
//! injected 503s and slow responses, two writers on one prefix, and a corrupted remote part.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use ckpt_core::{Engine, EngineConfig, Snapshot};
use ckpt_remote::{Error, Remote, RemoteConfig, Uploader};
use object_store::{ObjectStoreExt, PutPayload};
use test_support::s3::{BUCKET, Fault, FaultProxy, Moto};

fn config(endpoint: &str) -> RemoteConfig {
    RemoteConfig {
        part_size: 5 << 20,
        max_retries: 2,
        retry_timeout: Duration::from_secs(5),
        store_options: test_support::s3::store_options(endpoint),
        ..Default::default()
    }
}

fn url(prefix: &str) -> String {
    format!("s3://{BUCKET}/{prefix}")
}

fn payload(step: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 31 + step * 7) % 251) as u8)
        .collect()
}

/// Publishes a local checkpoint with a `big` MiB model part and a small trainer part.
fn save(engine: &mut Engine, step: u64, big_mib: usize) -> std::path::PathBuf {
    engine
        .submit(
            Snapshot::new(step)
                .with_bytes("model.bin", payload(step, big_mib << 20))
                .with_bytes("trainer.bin", payload(step + 1000, 100)),
        )
        .unwrap();
    let ev = engine.wait_idle().unwrap();
    ev.into_iter().find(|e| e.step == step).unwrap().path
}

/// No manifest object exists for `step`: nothing of it was published.
fn unpublished(remote: &Remote, step: u64) {
    match remote.manifest(step) {
        Err(Error::Corrupt { reason, .. }) if reason.contains("missing") => {}
        other => panic!("step {step} has a manifest on the server: {other:?}"),
    }
}

fn local() -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = Engine::open(EngineConfig::new(dir.path().join("ckpt"))).unwrap();
    (dir, engine)
}

fn same_parts(a: &Path, b: &Path) {
    for name in ["model.bin", "trainer.bin"] {
        assert_eq!(
            ckpt_core::read_part(a, name).unwrap(),
            ckpt_core::read_part(b, name).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn upload_list_verify_and_restore_round_trip_with_multipart_parts() {
    let moto = Moto::start();
    let mut cfg = config(&moto.endpoint());
    cfg.keep_last = Some(2);
    let remote = Remote::open(&url("run-a"), cfg).unwrap();
    let (_d, mut engine) = local();
    let mut up = Uploader::start(remote.clone()).unwrap();
    let mut dirs = Vec::new();
    for step in 1..=3 {
        // 12 MiB: three multipart chunks of 5 MiB.
        let dir = save(&mut engine, step, 12);
        up.submit(step, &dir).unwrap();
        dirs.push(dir);
    }
    let done = up.finish().unwrap();
    assert_eq!(done.iter().map(|u| u.step).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(done.iter().all(|u| u.latest));
    assert_eq!(done[2].removed, [1], "remote retention keeps the newest 2");

    let list = remote.list().unwrap();
    let steps: Vec<u64> = list.iter().map(|c| c.step).collect();
    assert_eq!(steps, [2, 3]);
    assert!(list.iter().all(|c| c.manifest.is_some()), "{list:?}");
    assert!(list[1].latest);
    assert_eq!(remote.latest().unwrap().as_deref(), Some("step-00000003"));
    remote.verify(3).unwrap();

    // A fresh local root restores from the remote copy, verified, through the engine.
    let (_d2, mut fresh) = local();
    let restored = remote.restore_newest(&mut fresh, None).unwrap().unwrap();
    assert_eq!(restored.step, 3);
    assert!(restored.skipped.is_empty());
    ckpt_core::verify_checkpoint(&restored.event.path).unwrap();
    same_parts(&restored.event.path, &dirs[2]);
    // Nothing newer than the local step: nothing to restore.
    assert!(
        remote
            .restore_newest(&mut fresh, Some(3))
            .unwrap()
            .is_none()
    );
}

#[test]
fn the_server_killed_mid_upload_publishes_nothing_and_the_next_upload_works() {
    let mut moto = Moto::start();
    let port = moto.port;
    let mut cfg = config(&moto.endpoint());
    // 4 MB/s: the 24 MiB part takes about 6 s, so the kill lands mid-upload.
    cfg.max_bytes_per_sec = Some(4_000_000);
    let remote = Remote::open(&url("run-kill"), cfg).unwrap();
    let (_d, mut engine) = local();
    let dir = save(&mut engine, 1, 24);
    let mut up = Uploader::start(remote.clone()).unwrap();
    up.submit(1, &dir).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    moto.kill();
    let err = up.wait_idle().unwrap_err();
    match &err {
        Error::Upload { step: 1, key, .. } => {
            assert!(key.contains("step-00000001/"), "{err}")
        }
        other => panic!("expected an upload error naming step 1, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("step 1") && msg.contains("run-kill/step-00000001/"),
        "{msg}"
    );

    // The server comes back (empty: moto keeps its state in memory).
    let _moto = Moto::start_on(port);
    assert!(
        remote.list().unwrap().iter().all(|c| c.manifest.is_none()),
        "nothing of step 1 is published"
    );
    let dir2 = save(&mut engine, 2, 1);
    up.submit(2, &dir2).unwrap();
    let done = up.finish().unwrap();
    assert!(done.iter().any(|u| u.step == 2 && u.latest));
    remote.verify(2).unwrap();
}

#[test]
fn injected_503s_and_slow_responses_never_half_publish() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.port);
    let remote = Remote::open(&url("run-faults"), config(&proxy.endpoint())).unwrap();
    let direct = Remote::open(&url("run-faults"), config(&moto.endpoint())).unwrap();
    let (_d, mut engine) = local();

    // Every request answered 503: the upload fails after its retries, naming step and key.
    proxy.set(Fault::ServiceUnavailable);
    let dir1 = save(&mut engine, 1, 6);
    let t = Instant::now();
    let err = remote.upload(&dir1).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Upload { step: 1, .. }), "{msg}");
    assert!(msg.contains("run-faults/step-00000001/"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(60), "retries are bounded");
    unpublished(&direct, 1);

    // 503s starting mid-upload (a multipart upload under way).
    proxy.set(Fault::Pass);
    let mut slow = config(&proxy.endpoint());
    slow.max_bytes_per_sec = Some(8_000_000);
    let throttled = Remote::open(&url("run-faults"), slow).unwrap();
    let dir2 = save(&mut engine, 2, 16);
    let mut up = Uploader::start(throttled).unwrap();
    up.submit(2, &dir2).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    proxy.set(Fault::ServiceUnavailable);
    let err = up.wait_idle().unwrap_err();
    assert!(matches!(err, Error::Upload { step: 2, .. }), "{err}");
    unpublished(&direct, 2);
    assert_eq!(direct.latest().unwrap(), None);

    // Slow responses: slower, but complete and valid.
    proxy.set(Fault::Slow);
    remote.upload(&dir2).unwrap();
    proxy.set(Fault::Pass);
    direct.verify(2).unwrap();
    // And the step that failed first uploads now (latest stays at the newer step 2).
    let u = remote.upload(&dir1).unwrap();
    assert!(!u.latest);
    assert_eq!(direct.latest().unwrap().as_deref(), Some("step-00000002"));
    direct.verify(1).unwrap();
    drop(up);
}

#[test]
fn two_writers_on_one_prefix_exactly_one_latest_wins() {
    let moto = Moto::start();
    let a = Remote::open(&url("shared"), config(&moto.endpoint())).unwrap();
    let b = Remote::open(&url("shared"), config(&moto.endpoint())).unwrap();
    let (_d, mut engine) = local();
    let dir = save(&mut engine, 1, 1);
    a.upload(&dir).unwrap();
    // Both read the same pointer, then both try to move it.
    let seen_a = a.latest_versioned().unwrap();
    let seen_b = b.latest_versioned().unwrap();
    assert_eq!(seen_a, seen_b);
    a.compare_and_set_latest(5, seen_a.as_ref()).unwrap();
    let err = b.compare_and_set_latest(6, seen_b.as_ref()).unwrap_err();
    match &err {
        Error::LostRace {
            step: 6, current, ..
        } => {
            assert_eq!(current.as_deref(), Some("step-00000005"))
        }
        other => panic!("expected LostRace, got {other}"),
    }
    assert!(err.to_string().contains("another writer"), "{err}");
    assert_eq!(a.latest().unwrap().as_deref(), Some("step-00000005"));

    // Creating the first pointer is create-only too.
    let c = Remote::open(&url("fresh"), config(&moto.endpoint())).unwrap();
    let d = Remote::open(&url("fresh"), config(&moto.endpoint())).unwrap();
    c.compare_and_set_latest(1, None).unwrap();
    assert!(matches!(
        d.compare_and_set_latest(2, None),
        Err(Error::LostRace { step: 2, .. })
    ));
}

#[test]
fn a_flipped_byte_in_a_remote_part_is_caught_and_restore_falls_back() {
    let moto = Moto::start();
    let remote = Remote::open(&url("run-flip"), config(&moto.endpoint())).unwrap();
    let (_d, mut engine) = local();
    let d1 = save(&mut engine, 1, 1);
    let d2 = save(&mut engine, 2, 1);
    remote.upload(&d1).unwrap();
    remote.upload(&d2).unwrap();

    // Flip one byte of step 2's model part on the server (same size: only the checksum
    // can tell).
    let store = Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_endpoint(moto.endpoint())
            .with_allow_http(true)
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_region("us-east-1")
            .build()
            .unwrap(),
    );
    let key = object_store::path::Path::from("run-flip/step-00000002/model.bin");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut bytes = store
            .get(&key)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        bytes[1234] ^= 0x40;
        store.put(&key, PutPayload::from(bytes)).await.unwrap();
    });

    // A part no manifest lists (an upload cut short) is garbage for gc; published ones stay.
    let orphan = object_store::path::Path::from("run-flip/step-00000009/model.bin");
    rt.block_on(store.put(&orphan, PutPayload::from(vec![1u8; 10])))
        .unwrap();
    assert!(
        remote
            .list()
            .unwrap()
            .iter()
            .any(|c| c.step == 9 && c.invalid.is_some())
    );
    assert_eq!(remote.garbage_collect().unwrap(), [9]);

    let err = remote.verify(2).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("run-flip/step-00000002/model.bin") && msg.contains("checksum mismatch"),
        "{msg}"
    );
    let (_d3, mut fresh) = local();
    let r = remote.restore_newest(&mut fresh, None).unwrap().unwrap();
    assert_eq!(r.step, 1, "falls back past the corrupt step 2");
    assert_eq!(r.skipped.len(), 1);
    assert!(
        r.skipped[0].1.contains("checksum mismatch"),
        "{:?}",
        r.skipped
    );
    same_parts(&r.event.path, &d1);
    // The corrupt download left nothing behind locally but the restored checkpoint.
    assert_eq!(
        test_support::fs::tmp_entries(fresh.root()),
        Vec::<String>::new()
    );
}

#[test]
fn an_outage_mid_upload_keeps_the_server_state_and_the_retry_completes_the_step() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.port);
    let direct = Remote::open(&url("run-outage"), config(&moto.endpoint())).unwrap();
    let (_d, mut engine) = local();
    let d1 = save(&mut engine, 1, 1);
    direct.upload(&d1).unwrap();

    // Step 2 goes up through the proxy at 8 MB/s; the network goes down under it.
    let mut slow = config(&proxy.endpoint());
    slow.max_bytes_per_sec = Some(8_000_000);
    let remote = Remote::open(&url("run-outage"), slow).unwrap();
    let d2 = save(&mut engine, 2, 16);
    let mut up = Uploader::start(remote.clone()).unwrap();
    up.submit(2, &d2).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    proxy.set(Fault::Down);
    let err = up.wait_idle().unwrap_err();
    assert!(matches!(err, Error::Upload { step: 2, .. }), "{err}");
    assert!(
        err.to_string().contains("run-outage/step-00000002/"),
        "{err}"
    );
    // The server kept its state: step 1 is intact and still `latest`; step 2 is unpublished.
    unpublished(&direct, 2);
    assert_eq!(direct.latest().unwrap().as_deref(), Some("step-00000001"));
    direct.verify(1).unwrap();

    // The network is back: the same step uploads and becomes `latest`.
    proxy.set(Fault::Pass);
    up.submit(2, &d2).unwrap();
    let done = up.finish().unwrap();
    assert!(done.iter().any(|u| u.step == 2 && u.latest), "{done:?}");
    direct.verify(2).unwrap();
}
