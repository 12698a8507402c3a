//! Training-thread stall per save, side by side in one run, for model + AdamW states of about
//! 10 MB, 100 MB and 1 GB on Flex:
//!
//! - `async`: our pipeline (`FrozenState::capture` + `Engine::submit`; encoding and writing run
//!   on the persist thread);
//! - `sync`: our blocking path (capture, encode, write, fsync, publish, then return);
//! - `burn`: what Burn's built-in checkpointer (`with_default_checkpointers`) does on the
//!   training thread: `model.clone().into_record()`, `optim.to_record()`,
//!   `scheduler.to_record()`, each handed to an `AsyncCheckpointer`;
//! - `memcpy_floor`: copying the same number of bytes into a pre-faulted buffer.
//!
//! Only the save call is timed. Between saves one (untimed) training step updates the state, as
//! in a real run, and the previous save is allowed to finish (untimed). The measurement kernels
//! are `ckpt_demo::perf`, shared with `examples/bench_report/`.
//!
//! `CKPT_STALL_SIZES` picks sizes (comma-separated of `10mb,100mb,1gb,4gb`; default the first
//! three). `CKPT_BENCH_DIR` sets where to write (default: a temporary directory under
//! `target/`).
// `criterion_group!` and `criterion_main!` generate undocumented public functions.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use ckpt_core::{Engine, EngineConfig, Retention};
use ckpt_demo::perf::{MemcpyFloor, StateSize, TrainState};
use common::bench_dir;
use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};

fn stall(c: &mut Criterion) {
    let wanted = std::env::var("CKPT_STALL_SIZES").unwrap_or_else(|_| "10mb,100mb,1gb".into());
    let dir = bench_dir();
    let mut g = c.benchmark_group("stall_per_save");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));

    for label in wanted.split(',') {
        let size = StateSize::by_label(label)
            .unwrap_or_else(|| panic!("CKPT_STALL_SIZES: unknown size {label:?}"));
        let label = size.label;
        let mut st = TrainState::new(size).unwrap();
        let bytes = st.state_bytes();
        eprintln!("stall_per_save/{label}: {} MB of state", bytes / 1_000_000);

        // Ours, async: capture (handle clones) + submit; the persist runs in the background.
        let root = dir.path().join(format!("async-{label}"));
        let (mut engine, _) =
            Engine::open(EngineConfig::new(&root).retention(Retention::keep_last(1))).unwrap();
        g.bench_function(BenchmarkId::new("async", label), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    st.train_step();
                    t += st.save_async(&mut engine).unwrap();
                    engine.wait_idle().unwrap();
                }
                t
            })
        });
        drop(engine);

        // Ours, blocking: the same bytes, encoded and made durable before returning.
        let root = dir.path().join(format!("sync-{label}"));
        let (mut engine, _) =
            Engine::open(EngineConfig::new(&root).retention(Retention::keep_last(1))).unwrap();
        g.bench_function(BenchmarkId::new("sync", label), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    st.train_step();
                    t += st.save_sync(&mut engine).unwrap().0;
                }
                t
            })
        });
        drop(engine);

        // Burn's built-in checkpointer, as the learner drives it.
        let root = dir.path().join(format!("burn-{label}"));
        g.bench_function(BenchmarkId::new("burn", label), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    st.train_step();
                    t += st.save_burn(&root).unwrap();
                }
                t
            })
        });

        // The physical floor of an eager host copy of the same bytes.
        let mut floor = MemcpyFloor::new(bytes);
        g.bench_function(BenchmarkId::new("memcpy_floor", label), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| floor.copy()).sum())
        });
    }
    g.finish();
}

criterion_group!(benches, stall);
criterion_main!(benches);
