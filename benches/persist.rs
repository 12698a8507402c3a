//! Persist throughput of the ckpt-core pipeline beside the physical floor (plain `write` +
//! `fsync` of the same bytes to the same filesystem), in the same run.
//!
//! `CKPT_BENCH_MIB` sets the state size (default 1024 MiB, written as 8 equal parts).
//! `CKPT_BENCH_DIR` sets where to write (default: a temporary directory under `target/`).

use std::{
    fs,
    io::Write,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use ckpt_core::{Engine, EngineConfig, PartData, Retention, Snapshot};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var("CKPT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn parts(total: usize) -> Vec<Arc<[u8]>> {
    let n = 8;
    (0..n)
        .map(|i| {
            let v: Vec<u8> = (0..total / n)
                .map(|j| (j as u64 * 2654435761 + i as u64) as u8)
                .collect();
            Arc::from(v)
        })
        .collect()
}

fn persist(c: &mut Criterion) {
    let mib: usize = std::env::var("CKPT_BENCH_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let total = mib << 20;
    let data = parts(total);
    let dir = bench_dir();
    let mut g = c.benchmark_group(format!("persist_{mib}MiB"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Bytes(total as u64));

    // The floor: write each part to a new file and fsync it, then fsync the directory.
    let floor_root = dir.path().join("floor");
    g.bench_function("write_fsync_floor", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for it in 0..iters {
                let d = floor_root.join(it.to_string());
                fs::create_dir_all(&d).unwrap();
                let start = Instant::now();
                for (i, p) in data.iter().enumerate() {
                    let mut f = fs::File::create(d.join(i.to_string())).unwrap();
                    for c in p.chunks(8 << 20) {
                        f.write_all(c).unwrap();
                    }
                    f.sync_all().unwrap();
                }
                fs::File::open(&d).unwrap().sync_all().unwrap();
                t += start.elapsed();
                fs::remove_dir_all(&d).unwrap();
            }
            t
        })
    });

    // ckpt-core: submit to published (tmp dir, checksums, fsyncs, manifest, rename, latest).
    let root = dir.path().join("engine");
    // Keep everything and delete old checkpoints outside the timed region, as the floor does.
    let (mut engine, _) =
        Engine::open(EngineConfig::new(&root).retention(Retention::keep_all())).unwrap();
    let mut step = 0u64;
    g.bench_function("ckpt_core_persist", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                step += 1;
                let mut s = Snapshot::new(step);
                for (i, p) in data.iter().enumerate() {
                    s = s.with_part(format!("part{i}.bin"), PartData::Shared(p.clone()));
                }
                let start = Instant::now();
                engine.submit(s).unwrap();
                engine.wait_idle().unwrap();
                t += start.elapsed();
                if step > 1 {
                    fs::remove_dir_all(root.join(ckpt_core::checkpoint_dir_name(step - 1)))
                        .unwrap();
                }
            }
            t
        })
    });
    g.finish();
    engine.finish().unwrap();
}

criterion_group!(benches, persist);
criterion_main!(benches);
