//! The command line: the flags ([`Args`]), the command that reproduces a run ([`cmdline`]) and
//! the plan of sizes, repetitions and run shapes derived from the flags ([`Plan`]).

use std::path::PathBuf;

use anyhow::{Result, bail};
use ckpt_demo::perf::StateSize;
use clap::Parser;

/// Run the burn-ckpt performance comparisons and write a Markdown report with plots.
#[derive(Debug, Parser)]
#[command(about)]
pub(crate) struct Args {
    /// State sizes for the stall, durability, restore and memory rows (of 10mb, 100mb, 1gb,
    /// 4gb). Default 10mb,100mb,1gb (10mb with --quick). A size needs about 5x its state in
    /// free memory (the state, the memcpy floor's two buffers, copy-on-write and encoding).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<String>>,
    /// Where LIBRARY.md, library.json and the PNGs go.
    #[arg(long, default_value = "docs/perf")]
    pub out: PathBuf,
    /// Small sizes and few repetitions: a smoke test of a minute or two.
    #[arg(long)]
    pub quick: bool,
    /// Where checkpoints are written (a temporary directory is made inside and removed).
    /// Default: `target/bench-report` of this workspace.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Saves measured per mode and size (default 5, 2 with --quick).
    #[arg(long)]
    pub reps: Option<usize>,
    /// TrueType font for the plot text.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    pub font: PathBuf,
}

/// The model and schedule of a measured training run (sections 3 and 6).
pub(crate) struct E2eShape {
    pub hidden: usize,
    pub layers: usize,
    pub steps: u64,
    pub every: u64,
}

impl E2eShape {
    /// The end-to-end runs of section 3.
    fn e2e(quick: bool) -> Self {
        if quick {
            E2eShape {
                hidden: 256,
                layers: 2,
                steps: 60,
                every: 20,
            }
        } else {
            E2eShape {
                hidden: 1024,
                layers: 8,
                steps: 400,
                every: 50,
            }
        }
    }

    /// The ZeRO runs of section 6.
    fn zero(quick: bool) -> Self {
        if quick {
            E2eShape {
                hidden: 256,
                layers: 2,
                steps: 6,
                every: 2,
            }
        } else {
            E2eShape {
                hidden: 1024,
                layers: 9,
                steps: 12,
                every: 4,
            }
        }
    }
}

/// What the run measures, from the flags (`--quick` picks the small variant of each).
pub(crate) struct Plan {
    /// State sizes of sections 1, 4 and 5, smallest first.
    pub sizes: Vec<StateSize>,
    /// Saves measured per mode and size.
    pub reps: usize,
    /// Restores measured per size.
    pub restore_reps: usize,
    /// Persists measured per mode (section 2).
    pub persist_reps: usize,
    /// Bytes of the persist measurement (section 2).
    pub persist_bytes: usize,
    pub e2e_shape: E2eShape,
    pub zero_shape: E2eShape,
    /// Runs per shard format (section 6).
    pub zero_rounds: usize,
    /// The memory budget the stall and memory sections hold saves to ([`SECTION_BUDGET`]).
    pub staging_budget: u64,
}

/// The memory budget the stall and memory sections hold saves to: 1 GiB, the trainer's
/// default before it became `auto` (half the memory available), kept so that those sections'
/// rows stay comparable from run to run.
pub(crate) const SECTION_BUDGET: u64 = 1 << 30;

impl Plan {
    /// The plan for `args`; fails on an unknown `--sizes` label.
    pub(crate) fn from_args(args: &Args) -> Result<Self> {
        let quick = args.quick;
        let sizes = sizes(args)?;
        let reps = args.reps.unwrap_or(if quick { 2 } else { 5 }).max(1);
        let restore_reps = if quick { 2 } else { 3 };
        let persist_reps = if quick { 2 } else { 5 };
        let persist_bytes = if quick {
            32 << 20
        } else {
            sizes
                .last()
                .map_or(256 << 20, |s| s.state_bytes())
                .min(1 << 30)
        };
        Ok(Self {
            sizes,
            reps,
            restore_reps,
            persist_reps,
            persist_bytes,
            e2e_shape: E2eShape::e2e(quick),
            zero_shape: E2eShape::zero(quick),
            zero_rounds: 2,
            staging_budget: SECTION_BUDGET,
        })
    }

    /// Units of work for the progress bar (one per repetition or phase).
    pub(crate) fn units(&self) -> u64 {
        (self.sizes.len() * (self.reps + 3) + self.persist_reps + 11 + 2 * self.zero_rounds) as u64
    }
}

/// The `--sizes` states (default by `--quick`), sorted by size, without duplicates.
fn sizes(args: &Args) -> Result<Vec<StateSize>> {
    let labels = args.sizes.clone().unwrap_or_else(|| {
        if args.quick {
            vec!["10mb".into()]
        } else {
            vec!["10mb".into(), "100mb".into(), "1gb".into()]
        }
    });
    let mut sizes = Vec::new();
    for l in &labels {
        match StateSize::by_label(l) {
            Some(s) => sizes.push(s),
            None => bail!("--sizes: unknown size {l:?} (known: 10mb, 100mb, 1gb, 4gb)"),
        }
    }
    sizes.sort_by_key(|s| s.state_bytes());
    sizes.dedup();
    Ok(sizes)
}

/// The `cargo run` command line that reproduces this run (profile, features and flags).
pub(crate) fn cmdline() -> String {
    let rest: Vec<String> = std::env::args().skip(1).collect();
    let features = match (cfg!(debug_assertions), cfg!(feature = "plots")) {
        (false, true) => " --release --features plots",
        (false, false) => " --release",
        (true, true) => " --features plots",
        (true, false) => "",
    };
    if rest.is_empty() {
        format!("cargo run{features} --example bench_report")
    } else {
        format!(
            "cargo run{features} --example bench_report -- {}",
            rest.join(" ")
        )
    }
}
