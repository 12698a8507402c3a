//! The `Tiny` learner fixture: a 4-8-1 MLP regressing 64 synthetic samples, with its batcher,
//! `TrainStep`/`InferenceStep` impls, learner (AdamW, cosine schedule) and data loaders, for
//! tests that drive Burn's `SupervisedTraining` (the learner hook, ZeRO in the learner).

use std::sync::{Arc, Mutex};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Relu};
use burn::optim::AdamWConfig;
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::tensor::{Device, Tensor};
use burn::train::{InferenceStep, Learner, RegressionOutput, TrainOutput, TrainStep};

/// Number of samples in [`data`].
pub const SAMPLES: usize = 64;

/// A 4-8-1 MLP with a ReLU and a dropout (probability 0 unless [`Tiny::with_dropout`]) in
/// between.
#[derive(Module, Debug)]
pub struct Tiny {
    l1: Linear,
    act: Relu,
    drop: Dropout,
    l2: Linear,
}

/// One training sample: 4 features and a target.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Features.
    pub x: [f32; 4],
    /// Target.
    pub y: f32,
}

/// A batch of samples: features `[n, 4]`, targets `[n, 1]`.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Features, `[n, 4]`.
    pub x: Tensor<2>,
    /// Targets, `[n, 1]`.
    pub y: Tensor<2>,
}

/// Stacks [`Sample`]s into a [`Batch`].
#[derive(Clone, Debug)]
pub struct TinyBatcher;

impl Batcher<Sample, Batch> for TinyBatcher {
    fn batch(&self, items: Vec<Sample>, device: &Device) -> Batch {
        let n = items.len();
        let xs: Vec<f32> = items.iter().flat_map(|s| s.x).collect();
        let ys: Vec<f32> = items.iter().map(|s| s.y).collect();
        Batch {
            x: Tensor::<1>::from_floats(xs.as_slice(), device).reshape([n, 4]),
            y: Tensor::<1>::from_floats(ys.as_slice(), device).reshape([n, 1]),
        }
    }
}

impl Tiny {
    /// A freshly initialized model (from the backend RNG as it is).
    pub fn new(device: &Device) -> Self {
        Self::with_dropout(device, 0.0)
    }

    /// [`Tiny::new`] with dropout probability `p` after the ReLU: training draws masks from
    /// the backend RNG.
    pub fn with_dropout(device: &Device, p: f64) -> Self {
        Self {
            l1: LinearConfig::new(4, 8).init(device),
            act: Relu::new(),
            drop: DropoutConfig::new(p).init(),
            l2: LinearConfig::new(8, 1).init(device),
        }
    }

    /// Seeds the (process-global) backend RNG of `device` with `seed`, then [`Tiny::new`].
    pub fn seeded(device: &Device, seed: u64) -> Self {
        device.seed(seed);
        Self::new(device)
    }

    fn regress(&self, b: Batch) -> RegressionOutput {
        let hidden = self.drop.forward(self.act.forward(self.l1.forward(b.x)));
        let out = self.l2.forward(hidden);
        let loss = MseLoss::new().forward(out.clone(), b.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, out, b.y)
    }
}

/// A hook every [`Tiny`] training step calls first (see [`on_train_step`]).
type StepHook = Box<dyn Fn() + Send>;

/// The hook set by [`on_train_step`].
static ON_TRAIN_STEP: Mutex<Option<StepHook>> = Mutex::new(None);

/// Calls `hook` at the start of every [`Tiny`] training step in this process, on the thread
/// running the step (`None`: no hook), so a test can observe the state between one optimizer
/// update and the next. The hook must be cheap and must not panic.
pub fn on_train_step(hook: Option<StepHook>) {
    *ON_TRAIN_STEP.lock().unwrap_or_else(|e| e.into_inner()) = hook;
}

impl TrainStep for Tiny {
    type Input = Batch;
    type Output = RegressionOutput;
    fn step(&self, b: Batch) -> TrainOutput<RegressionOutput> {
        if let Some(hook) = ON_TRAIN_STEP
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            hook();
        }
        let o = self.regress(b);
        TrainOutput::new(self, o.loss.backward(), o)
    }
}

impl InferenceStep for Tiny {
    type Input = Batch;
    type Output = RegressionOutput;
    fn step(&self, b: Batch) -> RegressionOutput {
        self.regress(b)
    }
}

/// The synthetic data set: [`SAMPLES`] points of `y = 2v - 0.3` with features
/// `[v, 1 - v, v², 0.5]`, `v` evenly spaced in `[0, 1)`.
pub fn data() -> Vec<Sample> {
    (0..SAMPLES)
        .map(|i| {
            let v = i as f32 / SAMPLES as f32;
            Sample {
                x: [v, 1.0 - v, v * v, 0.5],
                y: 2.0 * v - 0.3,
            }
        })
        .collect()
}

/// A learner for `model`: AdamW (defaults) and a cosine-annealing schedule from 1e-2 over 100
/// steps.
pub fn learner(model: Tiny) -> Learner<Tiny> {
    let scheduler = CosineAnnealingLrSchedulerConfig::new(1e-2, 100)
        .init()
        .unwrap();
    Learner::new(model, AdamWConfig::new().init(), scheduler)
}

/// A data loader as `SupervisedTraining` takes it.
pub type Loader<T> = Arc<dyn DataLoader<T>>;

/// Train and validation loaders over the same [`data`]: the train loader in batches of
/// `train_batch` (shuffled with seed `shuffle` if given, else in order), the validation loader
/// in order, in batches of 16.
pub fn loaders(train_batch: usize, shuffle: Option<u64>) -> (Loader<Batch>, Loader<Batch>) {
    let mut train = DataLoaderBuilder::new(TinyBatcher).batch_size(train_batch);
    if let Some(seed) = shuffle {
        train = train.shuffle(seed);
    }
    let valid = DataLoaderBuilder::new(TinyBatcher).batch_size(16);
    (
        train.build(InMemDataset::new(data())),
        valid.build(InMemDataset::new(data())),
    )
}
