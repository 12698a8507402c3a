//! The example trainer: an MLP with dropout, AdamW and a cosine LR schedule on a deterministic
//! synthetic dataset, checkpointed with burn-ckpt at optimizer-step boundaries.
//!
//! ```text
//! cargo run --example train -- --dir runs/demo --steps 200 --save-every 25
//! cargo run --example train -- --dir runs/demo --steps 400 --resume
//! ```
//!
//! Flags: `--help` (everyday flags first), and `docs/configuration.md`. Exit status 0 on success, non-zero
//! with a one-line reason on stderr otherwise:
//!
//! | status | meaning |
//! |---|---|
//! | 0 | trained to `--steps`; the last step is checkpointed |
//! | 1 | error (the line names the step and file where there is one) |
//! | 2 | bad flags |
//! | 75 | SIGTERM/SIGINT: stopped at a step boundary, final checkpoint durable (`--resume`) |
//! | 76 | SIGTERM/SIGINT: `--grace-period` ran out before the final checkpoint was durable |
//! | 128+N | a second signal N: exited at once |
//!
//! Preemption: the first SIGTERM or SIGINT makes the trainer stop at the next step boundary,
//! checkpoint that step through the normal pipeline and wait for it (and any save still in
//! flight) to be durable, for at most `--grace-period` seconds. A watchdog exits with 76 if the
//! trainer is still running `--grace-period` + 2 s after the signal (say it is stuck waiting
//! for a persist slot behind a stalled disk). A second signal exits at once; whatever was being
//! written is never published, and the next start removes it.

use std::{
    ffi::OsString,
    io::IsTerminal,
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI32, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};
use burn_ckpt::ckpt_core::{self, Backpressure, SaveErrorPolicy, session::StopOutcome};
use ckpt_demo::{Backend, DemoConfig, DemoReport, Frequency, SaveMode, StepInfo, run};
use clap::{Parser, ValueEnum};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};

/// Exit status: a stop signal ended the run and its final checkpoint is durable.
pub(crate) const EXIT_STOPPED: u8 = 75;
/// Exit status: a stop signal ended the run, but the grace period ran out first.
pub(crate) const EXIT_GRACE_EXPIRED: u8 = 76;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Async,
    Sync,
    Burn,
}

/// A switch flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// Every allocation of the trainer, large blocks backed by transparent huge pages unless
/// `--huge-pages off`.
#[global_allocator]
static ALLOC: burn_ckpt::ckpt_alloc::HugePages = burn_ckpt::ckpt_alloc::HugePages::new();

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OnSaveError {
    /// Exit non-zero with the error (it names the step and the file).
    Stop,
    /// Count the failed save in the report and keep training.
    Continue,
}

/// `--snapshot-budget-mb`: a number of MiB (0: no limit) or `auto`.
#[derive(Debug, Clone, Copy)]
enum Budget {
    /// [`ckpt_core::session::auto_snapshot_budget`].
    Auto,
    /// This many MiB; 0: no limit.
    Mib(u64),
}

/// `--memory-budget`: a fraction of the training time, or `off`.
#[derive(Debug, Clone, Copy)]
enum TierBudget {
    Fraction(f64),
    Off,
}

fn parse_tier_budget(s: &str) -> Result<TierBudget, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(TierBudget::Off);
    }
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(TierBudget::Fraction(f)),
        _ => Err(format!("{s:?} is neither a fraction in (0, 1] nor `off`")),
    }
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Budget::Auto);
    }
    s.parse()
        .map(Budget::Mib)
        .map_err(|_| format!("{s:?} is neither a number of MiB nor `auto`"))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackpressureArg {
    /// Wait for a free persist slot (counted as stall and `blocked_ms`).
    Block,
    /// Drop the checkpoint (counted as `skipped`); the last one is never dropped.
    Skip,
    /// Write it on the training thread.
    Sync,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OptimizerReadArg {
    /// Inside the save call on device runtimes with one queue (wgpu), after it on CUDA.
    Auto,
    /// Inside the save call, ahead of the next step's work.
    AtCapture,
    /// On the staging helper after the save call, beside the next forward and backward.
    Background,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum UpdateWaitArg {
    /// Wait where the held state is device memory (wgpu, CUDA), not on Flex.
    Auto,
    /// Always wait.
    Always,
    /// Never wait: the update copies what is still held.
    Never,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendArg {
    Flex,
    Wgpu,
    Cuda,
}

/// `--help` headings of the flags apart from the everyday ones.
const TUNING: &str = "Tuning (for benchmarks)";
const OBJECT_STORE: &str = "Object-store tier";
const ZERO: &str = "ZeRO-1 data parallel";
const MEMORY_TIER: &str = "Memory tier (ZeRO ranks)";

/// Train a small MLP with non-stalling, crash-safe checkpoints.
///
/// A flag given twice takes the last value, so wrapper scripts can append overrides.
#[derive(Debug, Parser)]
#[command(version, about, args_override_self = true)]
struct Args {
    /// Checkpoint root.
    #[arg(long, default_value = "runs/train")]
    dir: PathBuf,
    /// Base seed (weights, ParamIds, data order, dropout).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Global step the run ends at (a resumed run continues up to it).
    #[arg(long, default_value_t = 200)]
    steps: u64,
    /// Hidden width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Samples per epoch.
    #[arg(long, default_value_t = 1000)]
    dataset_size: usize,
    /// Checkpoint every N steps (0 disables checkpointing).
    #[arg(long, conflicts_with = "overhead_budget")]
    save_every: Option<u64>,
    /// Checkpoint as often as keeps the overhead under this fraction (e.g. 0.02).
    #[arg(long)]
    overhead_budget: Option<f64>,
    /// Keep only the newest K checkpoints (default 3, as the library's `ManagerConfig`).
    #[arg(long, overrides_with = "keep_all")]
    keep_last: Option<usize>,
    /// Keep every checkpoint (no retention). The later of --keep-last and --keep-all wins.
    #[arg(long, overrides_with = "keep_last")]
    keep_all: bool,
    /// async: our pipeline; sync: our blocking path (same bytes); burn: Burn's checkpointer.
    #[arg(long, value_enum, default_value_t = Mode::Async)]
    save_mode: Mode,
    /// Continue from the newest valid checkpoint in --dir, if there is one.
    #[arg(long)]
    resume: bool,
    /// Start over in a --dir that holds checkpoints: they are moved aside to .rewound-* first.
    /// Without --resume or --fresh such a --dir is refused before training starts.
    #[arg(long, conflicts_with = "resume")]
    fresh: bool,
    /// A fresh start takes its model (ParamIds included) from this checkpoint directory.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Abort the process right after step N's update (and its checkpoint submit).
    #[arg(long)]
    abort_at_step: Option<u64>,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Flex)]
    backend: BackendArg,
    /// Write a JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// After SIGTERM/SIGINT, wait at most this many seconds for the final checkpoint.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    grace_period: f64,
    /// When a checkpoint fails to persist (disk full, I/O error): stop, or count it and go on
    /// (a failure of the last checkpoint always stops).
    #[arg(long, value_enum, default_value_t = OnSaveError::Stop)]
    on_save_error: OnSaveError,
    /// What a save does when --max-in-flight checkpoints are still persisting.
    #[arg(long, value_enum, default_value_t = BackpressureArg::Block)]
    backpressure: BackpressureArg,
    /// Checkpoints persisting at once (bounds the memory they hold).
    #[arg(long, default_value_t = 1)]
    max_in_flight: usize,
    /// Extra memory a save may take, in MiB, or `auto`: half of the memory available at
    /// start. A save whose background peak (held state plus Burn's optimizer record, plus the
    /// copy of that record Burn's encoding makes for a moment) would exceed it still persists
    /// in the background, but training waits after submitting it until what it still holds
    /// leaves room for that copy. 0: no limit.
    #[arg(help_heading = TUNING, long, value_name = "MIB|auto", default_value = "auto", value_parser = parse_budget)]
    snapshot_budget_mb: Budget,
    /// Before each optimizer update, wait until the saves' staging has copied the state out
    /// (it overlaps the step's forward and backward passes), so the update writes in place
    /// instead of copying what a save still holds: a second copy of the state in device memory
    /// on GPU backends. The wait is counted in that save's stall.
    #[arg(help_heading = TUNING, long, value_enum, default_value_t = UpdateWaitArg::Auto)]
    update_wait: UpdateWaitArg,
    /// On a device backend (wgpu, CUDA), when a save reads the optimizer's state to host
    /// memory. Burn's record of it is lazy device reads; on a device with one queue (wgpu) a
    /// read made after the save call waits behind the next step's work, so `auto` reads it
    /// inside the save call there (a stall of one read of that state, nothing held at the next
    /// update) and after it on CUDA, whose threads have streams of their own. No effect on Flex.
    #[arg(help_heading = TUNING, long, value_enum, default_value_t = OptimizerReadArg::Auto)]
    optimizer_read: OptimizerReadArg,
    /// Back large allocations (4 MiB and more) with transparent huge pages
    /// (`ckpt_alloc::HugePages`): Burn's CPU backend and a save's record copies write mostly
    /// fresh memory, which then faults in 2 MiB at a time instead of 4 KiB. Takes effect where
    /// the kernel's THP mode is `madvise` or `always`.
    #[arg(help_heading = TUNING, long, value_enum, default_value_t = OnOff::On)]
    huge_pages: OnOff,
    /// Also upload every published checkpoint to this object-store prefix (s3://bucket/prefix;
    /// credentials and endpoint from the AWS_* variables); --resume then falls back to it when
    /// no local checkpoint is as new. Needs the `remote` feature.
    #[arg(help_heading = OBJECT_STORE, long, value_name = "URL")]
    upload_to: Option<String>,
    /// Remote retention: keep the newest N uploaded checkpoints (default: --keep-last).
    #[arg(help_heading = OBJECT_STORE, long, value_name = "N")]
    upload_keep_last: Option<usize>,
    /// Cap the upload bandwidth (MB/s), so uploads leave the network to training.
    #[arg(help_heading = OBJECT_STORE, long, value_name = "MBPS")]
    upload_max_mbps: Option<f64>,
    /// ZeRO-1 data-parallel ranks, as threads of this process (1: the single-device loop).
    #[arg(help_heading = ZERO, long, default_value_t = 1)]
    ranks: usize,
    /// How ZeRO-1 optimizer shards are written.
    #[arg(help_heading = ZERO, long, value_enum, default_value_t = ShardFormatArg::Consolidated)]
    shard_format: ShardFormatArg,
    /// Every rank reads the same batches (N ranks then match 1 rank byte for byte).
    #[arg(help_heading = ZERO, long)]
    replicate_data: bool,
    /// Where ranks run: threads of this process, or one MPI process each (`mpirun -n N`).
    #[arg(help_heading = ZERO, long, value_enum, default_value_t = Dist::Threads)]
    dist: Dist,
    /// Also keep each rank's newest steps in this node-local directory (tmpfs, for example
    /// /dev/shm/RUN), replicated to peer ranks on other nodes; --resume then restores the
    /// newest step every rank has there when it is newer than the disk's. `{node}` in it is
    /// replaced by the node index, to simulate nodes on one machine.
    #[arg(help_heading = MEMORY_TIER, long, value_name = "DIR")]
    memory_tier: Option<PathBuf>,
    /// Steps between two memory-tier saves, at the most (the budget may space them more).
    #[arg(help_heading = MEMORY_TIER, long, value_name = "N", default_value_t = 1)]
    memory_every: u64,
    /// The most memory-tier saves may cost training, as a fraction of its time (measured
    /// on every rank; a due save over it is skipped), or `off`: every due save is taken.
    #[arg(help_heading = MEMORY_TIER, long, value_name = "FRACTION|off", default_value = "0.05", value_parser = parse_tier_budget)]
    memory_budget: TierBudget,
    /// Peer ranks on other nodes that keep a replica of each rank's part.
    #[arg(help_heading = MEMORY_TIER, long, value_name = "N", default_value_t = 1)]
    replicas: usize,
    /// Ranks per node (default: the launcher's, OMPI_COMM_WORLD_LOCAL_SIZE or
    /// SLURM_NTASKS_PER_NODE; with --ranks threads, all ranks on one node).
    #[arg(help_heading = MEMORY_TIER, long, value_name = "N")]
    ranks_per_node: Option<usize>,
}

/// Ranks per node from the launcher's environment (Open MPI's `mpirun`, then Slurm).
fn launcher_ranks_per_node() -> Option<usize> {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ShardFormatArg {
    /// Gathered to rank 0 and merged into one `optim.bpk`.
    Consolidated,
    /// Every rank writes `optim.rank-<r>-of-<n>.bpk`.
    PerRank,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Dist {
    /// `--ranks` threads in this process.
    Threads,
    /// One rank per MPI process (feature `mpi`, launched by `mpirun`).
    Mpi,
}

/// Runs the ZeRO-1 trainer; `conclude` gets this process's rank (0 with threads) and its
/// report, and returns the exit status.
fn run_zero(
    args: &Args,
    cfg: &DemoConfig,
    on_step: &mut dyn FnMut(&StepInfo),
    conclude: impl FnOnce(usize, DemoReport) -> anyhow::Result<u8>,
) -> anyhow::Result<u8> {
    use burn_ckpt::ckpt_zero::ShardFormat;
    use ckpt_demo::zero::ZeroConfig;
    let mut z = ZeroConfig::new(cfg.clone(), args.ranks);
    z.shard_format = match args.shard_format {
        ShardFormatArg::Consolidated => ShardFormat::Consolidated,
        ShardFormatArg::PerRank => ShardFormat::PerRank,
    };
    z.replicate_data = args.replicate_data;
    if let Some(dir) = &args.memory_tier {
        let per_node = args
            .ranks_per_node
            .or_else(|| {
                (args.dist == Dist::Mpi)
                    .then(launcher_ranks_per_node)
                    .flatten()
            })
            .unwrap_or(args.ranks);
        let tier = burn_ckpt::ckpt_zero::MemoryTier::new(dir, args.memory_every)
            .replicas(args.replicas)
            .ranks_per_node(per_node);
        z.memory_tier = Some(match args.memory_budget {
            TierBudget::Fraction(f) => tier.budget(f),
            TierBudget::Off => tier.no_budget(),
        });
    }
    match args.dist {
        Dist::Threads => conclude(
            0,
            ckpt_demo::zero::run_threads(&z, on_step).context("training failed")?,
        ),
        #[cfg(feature = "mpi")]
        Dist::Mpi => ckpt_demo::zero::run_mpi(&z, on_step, conclude).context("training failed")?,
        #[cfg(not(feature = "mpi"))]
        Dist::Mpi => bail!("--dist mpi needs a build with `--features mpi`"),
    }
}

/// The first SIGTERM/SIGINT (0 until then).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

fn signal_name(sig: i32) -> &'static str {
    match sig {
        // Another rank received the signal first; the ranks agreed to stop.
        0 => "a stop request of another rank",
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGUSR1 => "SIGUSR1",
        _ => "a signal",
    }
}

/// Handles SIGTERM, SIGINT and SIGUSR1 on a dedicated thread (signal-hook's self-pipe
/// iterator): the first sets the returned flag, which the training loop checks at every step
/// boundary (on several ranks they agree on it, so all stop at the same step), and starts a
/// watchdog for the grace period; a second exits at once with 128 + the signal number.
/// SIGUSR1 is there for `mpirun`, which forwards it to every rank without killing them.
fn install_stop_handler(grace: Duration) -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGUSR1])
        .context("installing the SIGTERM/SIGINT/SIGUSR1 handler")?;
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let name = signal_name(sig);
                if STOP_SIGNAL
                    .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    eprintln!(
                        "received {name}: stopping at the next step boundary and writing a final \
                         checkpoint (grace period {:.0} s; send it again to exit at once)",
                        grace.as_secs_f64()
                    );
                    flag.store(true, Ordering::SeqCst);
                    let _ = std::thread::Builder::new()
                        .name("grace-watchdog".into())
                        .spawn(move || {
                            std::thread::sleep(grace + Duration::from_secs(2));
                            eprintln!(
                                "error: stopped by {name}: the grace period of {:.0} s ran out \
                                 before the final checkpoint was durable; the checkpoints \
                                 published before it are intact",
                                grace.as_secs_f64()
                            );
                            signal_hook::low_level::exit(EXIT_GRACE_EXPIRED.into());
                        });
                } else {
                    eprintln!(
                        "received {name} again: exiting at once; an unfinished checkpoint is \
                         not published (the newest published one is intact)"
                    );
                    signal_hook::low_level::exit(128 + sig);
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(stop)
}

fn backend(b: BackendArg) -> anyhow::Result<Backend> {
    match b {
        BackendArg::Flex => Ok(Backend::Flex),
        #[cfg(feature = "wgpu")]
        BackendArg::Wgpu => Ok(Backend::Wgpu),
        #[cfg(not(feature = "wgpu"))]
        BackendArg::Wgpu => bail!("--backend wgpu needs a build with `--features wgpu`"),
        BackendArg::Cuda => bail!("--backend cuda is not supported by this trainer yet"),
    }
}

/// Sends the libraries' events to stderr: level `warn` by default, `RUST_LOG` overrides (for
/// example `RUST_LOG=ckpt_core=debug`). Once per process; later calls keep the first.
fn install_log_subscriber() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .without_time()
        .try_init();
}

fn main_inner(args: Args) -> anyhow::Result<u8> {
    install_log_subscriber();
    ALLOC.set_enabled(args.huge_pages == OnOff::On);
    // Elsewhere than Linux the advice does not exist and the flag's help says so.
    if cfg!(target_os = "linux") && args.huge_pages == OnOff::On {
        match burn_ckpt::ckpt_alloc::thp_mode().as_deref() {
            Some("always" | "madvise") => {}
            mode => tracing::warn!(
                thp_mode = mode.unwrap_or("unavailable"),
                "--huge-pages on: the kernel's transparent huge pages are off, large blocks fault in 4 KiB pages"
            ),
        }
    }
    let mut cfg = DemoConfig::new(&args.dir);
    cfg.seed = args.seed;
    cfg.steps = args.steps;
    cfg.hidden = args.hidden;
    cfg.layers = args.layers;
    cfg.batch_size = args.batch_size;
    cfg.dataset_size = args.dataset_size;
    cfg.keep_last = match (args.keep_all, args.keep_last) {
        (true, _) => None,
        (false, Some(k)) => Some(k),
        (false, None) => cfg.keep_last,
    };
    cfg.frequency = match (args.save_every, args.overhead_budget) {
        (_, Some(f)) => Frequency::OverheadBudget(f),
        (Some(n), None) => Frequency::EverySteps(n),
        (None, None) => Frequency::EverySteps(25),
    };
    cfg.save_mode = match args.save_mode {
        Mode::Async => SaveMode::Async,
        Mode::Sync => SaveMode::Sync,
        Mode::Burn => SaveMode::Burn,
    };
    cfg.resume = args.resume;
    cfg.fresh = args.fresh;
    cfg.init_from = args.init_from.clone();
    cfg.abort_at_step = args.abort_at_step;
    cfg.backend = backend(args.backend)?;
    if !(args.grace_period.is_finite() && args.grace_period >= 0.0) {
        bail!("--grace-period must be a number of seconds, at least 0");
    }
    let grace = Duration::from_secs_f64(args.grace_period);
    cfg.grace_period = Some(grace);
    cfg.on_save_error = match args.on_save_error {
        OnSaveError::Stop => SaveErrorPolicy::Stop,
        OnSaveError::Continue => SaveErrorPolicy::Continue,
    };
    cfg.backpressure = match args.backpressure {
        BackpressureArg::Block => Backpressure::Block,
        BackpressureArg::Skip => Backpressure::Skip,
        BackpressureArg::Sync => Backpressure::Sync,
    };
    cfg.max_in_flight = args.max_in_flight;
    let optimizer_read = match args.optimizer_read {
        OptimizerReadArg::Auto => ckpt_burn::OptimizerRead::Auto,
        OptimizerReadArg::AtCapture => ckpt_burn::OptimizerRead::AtCapture,
        OptimizerReadArg::Background => ckpt_burn::OptimizerRead::Background,
    };
    let update_wait = match args.update_wait {
        UpdateWaitArg::Auto => ckpt_burn::UpdateWait::Auto,
        UpdateWaitArg::Always => ckpt_burn::UpdateWait::Always,
        UpdateWaitArg::Never => ckpt_burn::UpdateWait::Never,
    };
    let budget = match args.snapshot_budget_mb {
        Budget::Mib(0) => None,
        Budget::Mib(n) => Some(n << 20),
        Budget::Auto => {
            let b = ckpt_core::session::auto_snapshot_budget();
            match b {
                Some(b) => tracing::info!(
                    budget_mib = b >> 20,
                    "snapshot memory budget: half of the memory available now (--snapshot-budget-mb auto)"
                ),
                None => tracing::warn!(
                    "--snapshot-budget-mb auto: /proc/meminfo is unreadable here, so saves have no memory limit; give a number of MiB to set one"
                ),
            }
            b
        }
    };
    cfg.tuning = ckpt_burn::SaveTuning::default()
        .memory_budget(budget)
        .optimizer_read(optimizer_read)
        .update_wait(update_wait);
    cfg.upload_to = args.upload_to.clone();
    cfg.upload_keep_last = args.upload_keep_last;
    cfg.upload_max_mbps = args.upload_max_mbps;
    cfg.stop = Some(install_stop_handler(grace)?);

    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(cfg.steps);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let every = (cfg.steps / 20).max(1);
    let mut on_step = |s: &StepInfo| match &bar {
        Some(b) => {
            b.set_position(s.step);
            b.set_message(format!(
                "epoch {} loss {:.4} saved {} in-flight {}",
                s.epoch, s.loss, s.published, s.in_flight
            ));
        }
        None => {
            if s.step.is_multiple_of(every) || s.step == s.steps {
                eprintln!(
                    "step {}/{} epoch {} loss {:.4} saved {} in-flight {}",
                    s.step, s.steps, s.epoch, s.loss, s.published, s.in_flight
                );
            }
        }
    };
    let conclude = |rank: usize, report: DemoReport| {
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        conclude(&args, &cfg, grace, rank, report)
    };
    if args.ranks > 1 || args.dist == Dist::Mpi {
        run_zero(&args, &cfg, &mut on_step, conclude)
    } else if args.memory_tier.is_some() {
        bail!("--memory-tier keeps ZeRO ranks' parts: give --ranks N (N > 1) or --dist mpi")
    } else {
        conclude(0, run(&cfg, &mut on_step).context("training failed")?)
    }
}

/// Writes the report and prints how the run ended (rank 0 only); returns the exit status,
/// the same on every rank.
fn conclude(
    args: &Args,
    cfg: &DemoConfig,
    grace: Duration,
    rank: usize,
    report: DemoReport,
) -> anyhow::Result<u8> {
    if rank != 0 {
        // Another MPI rank: rank 0 reports; the exit status is the same on every rank.
        return Ok(match report.stopped.map(|s| s.outcome) {
            Some(StopOutcome::GraceExpired) => EXIT_GRACE_EXPIRED,
            Some(_) => EXIT_STOPPED,
            None => 0,
        });
    }
    if let Some(path) = &args.report {
        let mut json = serde_json::to_value(&report).context("encoding the report")?;
        // What `--huge-pages` did: asked for, the kernel's mode, and how many blocks were
        // advised (0 with `off`).
        json["huge_pages"] = serde_json::json!({
            "requested": args.huge_pages == OnOff::On,
            "thp_mode": burn_ckpt::ckpt_alloc::thp_mode(),
            "advised_blocks": ALLOC.advised_blocks(),
        });
        let json = serde_json::to_vec_pretty(&json).context("encoding the report")?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    if let Some(first) = report.failed_saves.first() {
        eprintln!(
            "warning: {} checkpoint(s) failed and training went on (--on-save-error continue); \
             the first: {}",
            report.failed_saves.len(),
            first.error
        );
    }
    if let Some(stop) = &report.stopped {
        let name = signal_name(STOP_SIGNAL.load(Ordering::SeqCst));
        let dir = cfg
            .dir
            .join(ckpt_core::layout::checkpoint_dir_name(stop.step));
        return Ok(match stop.outcome {
            StopOutcome::Saved => {
                eprintln!(
                    "stopped by {name} at step {}: final checkpoint {} is durable (waited \
                     {:.0} ms); continue with --resume",
                    stop.step,
                    dir.display(),
                    stop.wait_ms
                );
                EXIT_STOPPED
            }
            StopOutcome::NotSaved => {
                eprintln!(
                    "stopped by {name} at step {} (checkpointing is off: nothing saved)",
                    stop.step
                );
                EXIT_STOPPED
            }
            StopOutcome::GraceExpired => {
                let newest = ckpt_core::read_latest(&cfg.dir)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| "none".into());
                eprintln!(
                    "error: stopped by {name} at step {}: the grace period of {:.0} s ran out \
                     before its checkpoint was durable; newest published checkpoint: {newest}",
                    stop.step,
                    grace.as_secs_f64()
                );
                EXIT_GRACE_EXPIRED
            }
        });
    }
    let stall: f64 = report.saves.iter().map(|s| s.stall_ms).sum();
    let mut pressure = String::new();
    if report.skipped > 0 {
        pressure.push_str(&format!(", {} skipped (pipeline full)", report.skipped));
    }
    if report.blocked_ms >= 1.0 {
        pressure.push_str(&format!(
            ", {:.0} ms blocked waiting for a persist slot",
            report.blocked_ms
        ));
    }
    if !report.saves.is_empty() {
        // Stalls, slower steps after each save, and the wait at the end (the report's `lost`).
        pressure.push_str(&format!(
            ", training time lost to checkpoints {:.2} s (of it {:.2} s waiting for the last \
             save at the end)",
            report.lost.total_ms / 1e3,
            report.lost.final_wait_ms / 1e3
        ));
    }
    eprintln!(
        "done: steps {}..{} in {:.1}s, {} checkpoints, total stall {:.2} ms{pressure}{}",
        report.start_step,
        report.final_step,
        report.wall_s,
        report.saves.len(),
        stall,
        report
            .resumed_from
            .as_ref()
            .map(|p| format!(
                ", resumed from step {} ({}{})",
                report.start_step,
                p.display(),
                report
                    .resumed_from_remote
                    .as_ref()
                    .map(|u| format!(", downloaded from {u}"))
                    .or_else(|| report
                        .resumed_from_memory
                        .as_ref()
                        .map(|m| format!(", memory tier: rank 0 from {m}")))
                    .unwrap_or_default()
            ))
            .unwrap_or_default()
    );
    if let Some(m) = &report.memory_tier {
        let median = |v: Vec<f64>| {
            let mut v = v;
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let phase = |f: fn(&burn_ckpt::ckpt_zero::SavePhases) -> f64| {
            median(m.phases.iter().map(f).collect())
        };
        eprintln!(
            "memory tier: {} saves whole (newest step {}), {} skipped while one ran, {} over the \
             budget, {} not whole; median {:.1} ms each (own part {:.1}, read {:.1}, exchange \
             {:.1}, replicas {:.1}, agreement {:.1}); cost training {} on rank 0; peak {:.1} MB \
             on rank 0{}",
            m.saved.len(),
            m.saved.last().map_or("-".into(), |s| s.to_string()),
            m.skipped,
            m.throttled,
            m.failed,
            median(m.save_ms.clone()),
            phase(|p| p.own_ms),
            phase(|p| p.read_ms),
            phase(|p| p.exchange_ms),
            phase(|p| p.replica_ms),
            phase(|p| p.agree_ms),
            match m.lost_s {
                Some(l) => format!(
                    "{l:.2} s of {:.1} s ({:.1} %)",
                    m.training_s,
                    100.0 * l / m.training_s.max(1e-9)
                ),
                None => "unmeasured (too few steps without a save for a baseline)".into(),
            },
            m.peak_bytes as f64 / 1e6,
            if m.off { "; OFF after a failure" } else { "" }
        );
    }
    if !report.uploads.is_empty() {
        let bytes: u64 = report.uploads.iter().map(|u| u.bytes).sum();
        eprintln!(
            "uploaded {} checkpoints ({:.1} MB) to {}",
            report.uploads.len(),
            bytes as f64 / 1e6,
            cfg.upload_to.as_deref().unwrap_or_default()
        );
    }
    Ok(0)
}

/// Runs the trainer with command-line `argv` (program name first); returns the exit status.
/// `main` is this on the process's arguments; the reliability tests call it in child processes.
pub(crate) fn cli(argv: impl IntoIterator<Item = OsString>) -> u8 {
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match main_inner(args) {
        Ok(code) => code,
        Err(e) => {
            // One line; skip causes already contained in the message before them.
            let mut line = String::new();
            for cause in e.chain().map(|c| c.to_string()) {
                if !line.ends_with(&cause) {
                    if !line.is_empty() {
                        line.push_str(": ");
                    }
                    line.push_str(&cause);
                }
            }
            eprintln!("error: {line}");
            1
        }
    }
}

fn main() -> ExitCode {
    ExitCode::from(cli(std::env::args_os()))
}
