//! Upload throughput of the object-store tier beside a plain multipart upload of the same
//! bytes to the same server, alternating, in one run (medians and ranges). The server is a
//! real S3-compatible one (`moto_server`) on loopback, started here.
//!
//! `CKPT_UPLOAD_MIB` sets the checkpoint size (default 256 MiB, one 8 MiB-chunked part plus a
//! small one), `CKPT_UPLOAD_REPS` the repetitions (default 5).

use std::time::{Duration, Instant};

use ckpt_core::{Engine, EngineConfig, Snapshot};
use ckpt_remote::{Remote, RemoteConfig};
use object_store::{ObjectStoreExt, WriteMultipart, aws::AmazonS3Builder};
use test_support::s3::{BUCKET, Moto};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mib: usize = std::env::var("CKPT_UPLOAD_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let reps: usize = std::env::var("CKPT_UPLOAD_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let part = 8 << 20;
    let concurrency = 4;
    let moto = Moto::start();
    let tmp = tempfile::tempdir().unwrap();
    let (mut engine, _) = Engine::open(EngineConfig::new(tmp.path().join("ckpt"))).unwrap();
    let data: Vec<u8> = (0..mib << 20).map(|i| (i % 251) as u8).collect();
    engine
        .submit(
            Snapshot::new(1)
                .with_bytes("model.bin", data.clone())
                .with_bytes("trainer.bin", vec![7u8; 100]),
        )
        .unwrap();
    let dir = engine.wait_idle().unwrap().remove(0).path;

    let opts: Vec<(String, String)> = test_support::s3::store_options(&moto.endpoint());
    let store = AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_endpoint(moto.endpoint())
        .with_allow_http(true)
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_region("us-east-1")
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let plain = |i: usize| -> Duration {
        let t = Instant::now();
        rt.block_on(async {
            let key = object_store::path::Path::from(format!("plain-{i}/model.bin"));
            let up = store.put_multipart(&key).await.unwrap();
            let mut w = WriteMultipart::new_with_chunk_size(up, part);
            for c in data.chunks(part) {
                w.wait_for_capacity(concurrency).await.unwrap();
                w.put(bytes::Bytes::copy_from_slice(c));
            }
            w.finish().await.unwrap();
        });
        t.elapsed()
    };
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    for i in 0..reps {
        floor.push(plain(i).as_secs_f64());
        let remote = Remote::open(
            &format!("s3://{BUCKET}/ours-{i}"),
            RemoteConfig {
                part_size: part,
                concurrency,
                store_options: opts.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        let t = Instant::now();
        remote.upload(&dir).unwrap();
        ours.push(t.elapsed().as_secs_f64());
        let _ = rt.block_on(store.delete(&object_store::path::Path::from(format!(
            "plain-{i}/model.bin"
        ))));
    }
    let mb = mib as f64 * 1.048576;
    let (o, f) = (median(&mut ours), median(&mut floor));
    println!(
        "upload {mib} MiB to moto_server, part {} MiB x {concurrency} in flight, {reps} reps:",
        part >> 20
    );
    println!(
        "  ckpt-remote upload (parts, XXH3 check, manifest, conditional latest): median {:.2} s ({:.0} MB/s), range {:.2}-{:.2} s",
        o,
        mb / o,
        ours[0],
        ours[ours.len() - 1]
    );
    println!(
        "  plain multipart upload of the same bytes: median {:.2} s ({:.0} MB/s), range {:.2}-{:.2} s",
        f,
        mb / f,
        floor[0],
        floor[floor.len() - 1]
    );
    println!("  throughput ratio ours / plain: {:.2}", f / o);
}
