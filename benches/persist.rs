//! Persist throughput of the ckpt-core pipeline beside the physical floor (plain `write` +
//! `fsync` of the same bytes to the same filesystem), in the same run. The measurement kernels
//! are `ckpt_demo::perf`, shared with `examples/bench_report/`.
//!
//! `CKPT_BENCH_MIB` sets the state size (default 1024 MiB, written as 8 equal parts).
//! `CKPT_BENCH_DIR` sets where to write (default: a temporary directory under `target/`).
// `criterion_group!` and `criterion_main!` generate undocumented public functions.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use ckpt_core::{Engine, EngineConfig, Retention};
use ckpt_demo::perf::{engine_persist, persist_parts, write_fsync_floor};
use common::bench_dir;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn persist(c: &mut Criterion) {
    let mib: usize = std::env::var("CKPT_BENCH_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let total = mib << 20;
    let data = persist_parts(total, 8);
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
            (0..iters)
                .map(|it| write_fsync_floor(&floor_root.join(it.to_string()), &data).unwrap())
                .sum()
        })
    });

    // ckpt-core: submit to published (tmp dir, checksums, fsyncs, manifest, rename, latest).
    // Keep everything and delete old checkpoints outside the timed region, as the floor does.
    let root = dir.path().join("engine");
    let (mut engine, _) =
        Engine::open(EngineConfig::new(&root).retention(Retention::keep_all())).unwrap();
    let mut step = 0u64;
    g.bench_function("ckpt_core_persist", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                step += 1;
                t += engine_persist(&mut engine, step, &data).unwrap().0;
            }
            t
        })
    });
    g.finish();
    engine.finish().unwrap();
}

criterion_group!(benches, persist);
criterion_main!(benches);
