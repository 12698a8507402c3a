//! The demo model and data: an MLP with dropout on a deterministic synthetic regression
//! dataset, AdamW and a cosine LR schedule, on Flex (CPU) or wgpu (CubeCL).

use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Relu};
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{AdamWConfig, ModuleOptimizer};
use burn::tensor::{Device, Tensor};
use ckpt_burn::mix_seed;

use crate::{Error, Result};

/// Input features of the synthetic dataset.
pub const INPUT_DIM: usize = 16;
/// Iterations of the cosine schedule (fixed, so a resumed run with a larger `--steps`
/// continues the same curve).
pub const SCHEDULE_ITERS: usize = 2000;

/// The MLP: `layers` hidden `Linear + ReLU` blocks, dropout, and a linear head.
#[derive(Module, Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
    act: Relu,
    dropout: Dropout,
    head: Linear,
}

impl Mlp {
    /// A freshly initialized model; weights come from the device RNG, so seed it first.
    pub fn new(hidden: usize, layers: usize, dropout: f64, device: &Device) -> Self {
        let mut v = Vec::with_capacity(layers);
        let mut d_in = INPUT_DIM;
        for _ in 0..layers.max(1) {
            v.push(LinearConfig::new(d_in, hidden).init(device));
            d_in = hidden;
        }
        Self {
            layers: v,
            act: Relu::new(),
            dropout: DropoutConfig::new(dropout).init(),
            head: LinearConfig::new(d_in, 1).init(device),
        }
    }

    /// Forward pass: `[batch, INPUT_DIM] -> [batch, 1]`.
    pub fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        for l in &self.layers {
            x = self.act.forward(l.forward(x));
        }
        self.head.forward(self.dropout.forward(x))
    }
}

/// One sample of the synthetic dataset.
#[derive(Debug, Clone)]
pub struct Sample {
    x: [f32; INPUT_DIM],
    y: f32,
}

/// A batch on a device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Inputs `[n, INPUT_DIM]`.
    pub x: Tensor<2>,
    /// Targets `[n, 1]`.
    pub y: Tensor<2>,
}

/// Builds [`Batch`]es.
#[derive(Debug, Clone, Copy)]
pub struct SampleBatcher;

impl Batcher<Sample, Batch> for SampleBatcher {
    fn batch(&self, items: Vec<Sample>, device: &Device) -> Batch {
        let n = items.len();
        let xs: Vec<f32> = items.iter().flat_map(|s| s.x).collect();
        let ys: Vec<f32> = items.iter().map(|s| s.y).collect();
        Batch {
            x: Tensor::<1>::from_floats(xs.as_slice(), device).reshape([n, INPUT_DIM]),
            y: Tensor::<1>::from_floats(ys.as_slice(), device).reshape([n, 1]),
        }
    }
}

/// The deterministic synthetic dataset: `n` samples, a smooth nonlinear target.
pub fn synthetic_dataset(n: usize, seed: u64) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let mut x = [0f32; INPUT_DIM];
            for (j, v) in x.iter_mut().enumerate() {
                let r = mix_seed(&[seed, i as u64, j as u64]);
                *v = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            }
            let s: f32 = x
                .iter()
                .enumerate()
                .map(|(j, v)| v * ((j % 5) as f32 - 2.0))
                .sum();
            Sample {
                x,
                y: s.sin() + 0.1 * x[0] * x[1],
            }
        })
        .collect()
}

/// The compute backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Burn's pure-Rust CPU backend.
    Flex,
    /// CubeCL through wgpu (feature `wgpu`).
    #[cfg(feature = "wgpu")]
    Wgpu,
}

impl Backend {
    /// The device for this backend.
    pub fn device(self) -> Device {
        match self {
            Backend::Flex => Device::flex(),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        }
    }
}

/// The demo's optimizer: AdamW with weight decay 0.01.
pub fn optimizer() -> ModuleOptimizer {
    AdamWConfig::new().with_weight_decay(1e-2).init()
}

/// The demo's LR schedule: cosine annealing from `lr` to `0.05 * lr` over [`SCHEDULE_ITERS`].
pub fn scheduler(lr: f64) -> Result<ModuleLrScheduler> {
    CosineAnnealingLrSchedulerConfig::new(lr, SCHEDULE_ITERS)
        .with_min_lr(lr * 0.05)
        .init()
        .map_err(|e| Error::Config(e.to_string()))
}
