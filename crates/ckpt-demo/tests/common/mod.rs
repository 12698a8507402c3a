//! What the ZeRO trainer tests share: a small, fast configuration.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use ckpt_demo::zero::ZeroConfig;
use ckpt_demo::{DemoConfig, Frequency};

/// `ranks` ranks training a 2 x 32 MLP on 100 samples in batches of 8 to `steps`, saving every
/// 4 steps, keeping everything; `timeout` for every collective call.
pub(crate) fn small(dir: &Path, ranks: usize, steps: u64, timeout: Duration) -> ZeroConfig {
    let mut d = DemoConfig::new(dir);
    d.hidden = 32;
    d.layers = 2;
    d.batch_size = 8;
    d.dataset_size = 100;
    d.keep_last = None;
    d.steps = steps;
    d.frequency = Frequency::EverySteps(4);
    let mut z = ZeroConfig::new(d, ranks);
    z.timeout = timeout;
    z
}
