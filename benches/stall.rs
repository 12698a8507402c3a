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
//! in a real run, and the previous save is allowed to finish (untimed).
//!
//! `CKPT_STALL_SIZES` picks sizes (comma-separated of `10mb,100mb,1gb`; default all three).
//! `CKPT_BENCH_DIR` sets where to write (default: a temporary directory under `target/`).

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::store::ModuleRecord;
use burn::tensor::{Device, Distribution, Tensor};
use burn::train::checkpoint::{AsyncCheckpointer, Checkpointer, FileCheckpointer};
use burn_ckpt::ckpt_burn::demo::{INPUT_DIM, Mlp};
use burn_ckpt::ckpt_burn::{DataCursor, FrozenState, TrainerState};
use ckpt_core::{Engine, EngineConfig, Retention};
use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};

/// (label, hidden width, hidden layers): model + two AdamW moments = 12 bytes per parameter.
const SIZES: [(&str, usize, usize); 3] = [("10mb", 512, 4), ("100mb", 1024, 9), ("1gb", 4096, 6)];

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var("CKPT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

struct State {
    device: Device,
    model: Mlp,
    optim: ModuleOptimizer,
    sched: ModuleLrScheduler,
    step: u64,
}

impl State {
    fn new(hidden: usize, layers: usize) -> Self {
        let device = Device::flex().autodiff();
        device.seed(1);
        let model = Mlp::new(hidden, layers, 0.1, &device);
        let optim = AdamWConfig::new().with_weight_decay(1e-2).init();
        let sched = CosineAnnealingLrSchedulerConfig::new(1e-3, 2000)
            .init()
            .unwrap();
        let mut s = Self {
            device,
            model,
            optim,
            sched,
            step: 0,
        };
        s.train_step(); // creates the optimizer moments
        s
    }

    fn train_step(&mut self) {
        let x = Tensor::<2>::random([8, INPUT_DIM], Distribution::Default, &self.device);
        let y = Tensor::<2>::random([8, 1], Distribution::Default, &self.device);
        let loss = MseLoss::new().forward(self.model.forward(x), y, Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &self.model);
        let lr = self.sched.step();
        self.model = self.optim.step(lr, self.model.clone(), grads);
        self.step += 1;
    }

    fn trainer(&self) -> TrainerState {
        TrainerState::new(self.step, DataCursor::default(), 1)
    }

    /// Bytes of model + optimizer state (what every mode writes, minus small files).
    fn bytes(&self) -> usize {
        let params = self.model.num_params();
        params * 4 * 3
    }
}

fn stall(c: &mut Criterion) {
    let wanted = std::env::var("CKPT_STALL_SIZES").unwrap_or_else(|_| "10mb,100mb,1gb".into());
    let dir = bench_dir();
    let mut g = c.benchmark_group("stall_per_save");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));

    for (label, hidden, layers) in SIZES {
        if !wanted.split(',').any(|w| w.trim() == label) {
            continue;
        }
        let mut st = State::new(hidden, layers);
        let bytes = st.bytes();
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
                    let start = Instant::now();
                    let frozen =
                        FrozenState::capture(&st.model, &st.optim, &st.sched, st.trainer());
                    engine.submit(frozen.into_snapshot()).unwrap();
                    t += start.elapsed();
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
                    let start = Instant::now();
                    let frozen =
                        FrozenState::capture(&st.model, &st.optim, &st.sched, st.trainer());
                    engine
                        .submit(frozen.encode().unwrap().into_snapshot())
                        .unwrap();
                    engine.wait_idle().unwrap();
                    t += start.elapsed();
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
                for i in 0..iters {
                    let model_ck: AsyncCheckpointer<ModuleRecord> =
                        AsyncCheckpointer::new(FileCheckpointer::new(&root, "model"));
                    let optim_ck: AsyncCheckpointer<burn::optim::OptimizerRecord> =
                        AsyncCheckpointer::new(FileCheckpointer::new(&root, "optim"));
                    let sched_ck: AsyncCheckpointer<burn::optim::lr_scheduler::LrSchedulerRecord> =
                        AsyncCheckpointer::new(FileCheckpointer::new(&root, "scheduler"));
                    st.train_step();
                    let e = i as usize;
                    let start = Instant::now();
                    model_ck.save(e, st.model.clone().into_record()).unwrap();
                    optim_ck.save(e, st.optim.to_record()).unwrap();
                    sched_ck.save(e, st.sched.to_record()).unwrap();
                    t += start.elapsed();
                    // Dropping joins the writer threads (untimed), like the next save would
                    // wait behind them.
                    drop((model_ck, optim_ck, sched_ck));
                    let _ = std::fs::remove_dir_all(&root);
                }
                t
            })
        });

        // The physical floor of an eager host copy of the same bytes.
        let src = vec![1u8; bytes];
        let mut dst = vec![0u8; bytes]; // written once: pre-faulted
        g.bench_function(BenchmarkId::new("memcpy_floor", label), |b| {
            b.iter(|| {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&dst);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, stall);
criterion_main!(benches);
