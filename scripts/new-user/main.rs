//! A new user's first program, outside the workspace: a small regression model trained by a
//! loop of one's own, with the README's custom-loop lines pasted in where `README_SNIPPET`
//! stands (by `scripts/new-user-project.sh`; this file is a template, not part of the build).
//! `cargo run -- STEPS` trains up to global step STEPS, resuming where the last run
//! of the same root stopped.

use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Tensor};

#[derive(Module, Debug)]
struct Mlp {
    l1: Linear,
    act: Relu,
    l2: Linear,
}

impl Mlp {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.l2.forward(self.act.forward(self.l1.forward(x)))
    }
}

/// One optimizer step on a batch of `y = 2v - 0.3`, chosen by the step.
fn train_step(device: &Device, model: &mut Mlp, optim: &mut ModuleOptimizer, sched: &mut ModuleLrScheduler, step: u64) {
    let v: Vec<f32> = (0..16).map(|i| ((step * 16 + i) % 64) as f32 / 64.0).collect();
    let y: Vec<f32> = v.iter().map(|v| 2.0 * v - 0.3).collect();
    let x = Tensor::<1>::from_floats(v.as_slice(), device).reshape([16, 1]);
    let y = Tensor::<1>::from_floats(y.as_slice(), device).reshape([16, 1]);
    let loss = MseLoss::new().forward(model.forward(x), y, Reduction::Mean);
    let grads = GradientsParams::from_grads(loss.backward(), &*model);
    let lr = sched.step();
    *model = optim.step(lr, model.clone(), grads);
}

fn run(steps: u64) -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::flex().autodiff();
    let mut model = Mlp {
        l1: LinearConfig::new(1, 32).init(&device),
        act: Relu::new(),
        l2: LinearConfig::new(32, 1).init(&device),
    };
    let mut optim: ModuleOptimizer = AdamWConfig::new().init();
    let mut sched: ModuleLrScheduler = CosineAnnealingLrSchedulerConfig::new(1e-2, 1000).init()?;
    let mut last = 0;
    let mut train_one_step = |model: &mut Mlp, optim: &mut ModuleOptimizer, sched: &mut ModuleLrScheduler| {
        last += 1;
        train_step(&device, model, optim, sched, last);
    };
    // README_SNIPPET
    println!("trained steps {}..={steps}, {} checkpoints saved", start + 1, report.session.saves.len());
    Ok(())
}

fn main() {
    let steps = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(250);
    if let Err(e) = run(steps) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
