//! The memory tier's costs and recovery times (issue 32's benchmark): the example trainer on 4
//! ZeRO-1 rank threads as 2 simulated nodes (`--ranks 4 --ranks-per-node 2`, per-rank shards),
//! tier on `/dev/shm`. Writes `MEMORY_TIER.md` and `memory_tier.json` into `--out`.
//!
//! ```text
//! cargo build --release --features remote --example train --example memory_tier_bench \
//!     --example learner_bench
//! target/release/examples/memory_tier_bench                  # 400mb and 1gb
//! target/release/examples/memory_tier_bench --sizes 10mb     # smoke test
//! ```
//!
//! For each size:
//! - **Training cost**: runs without checkpoints, with a disk save every 10 steps, and with a
//!   memory save every step (under the default 5 % budget, and with the budget off) and every
//!   10 steps (disk saves only at the end). *Lost per save* is
//!   the run's wall time over the run without checkpoints, less the wait for the final disk
//!   save, over the saves that training followed (memory: the saves whole on every rank).
//! - **Work lost per failure**: for a failure at a uniformly random step, the mean number of
//!   steps since the newest checkpoint saved before it (whole memory saves, or disk saves).
//! - **Recovery**: one run killed (`--abort-at-step`) with a memory save every step, disk every
//!   10 steps and uploads to a local S3 server (`moto_server`); copies of its root and tier
//!   are restarted four ways, and the time from the restart to the first training step is
//!   measured: from each rank's own memory tier, from the peers' replicas (node 1's directory
//!   wiped), from the disk (no tier; the checkpoint's pages evicted from the page cache with
//!   `posix_fadvise(DONTNEED)`, since this machine does not allow dropping caches), and from
//!   the object store (local root and tier gone).
//! - **Memory**: the tier's bytes on `/dev/shm` after the killed run (every node), and the
//!   runs' peak RSS, and its excess over the runs without checkpoints.
//! - **Stall per save**: the time a save held rank 0's training thread, as the library
//!   measured it (`MemoryTierReport::stall_ms`, a disk save's `stall_ms`).
//! - **Burn's learner route** (`learner_bench`, unless `--no-learner`): a plain
//!   `SupervisedTraining` program with ZeRO-1 on 4 rank threads (`ZeroTrainingStrategy`) as 2
//!   simulated nodes, without checkpoints (twice), with a disk save every 10 steps, and with
//!   the docs' memory-tier lines besides (a save due every step, default budget and off); and
//!   on one device, Burn's own checkpointer against no checkpoints at the same steps. Stall per
//!   save from the step gaps against the runs without checkpoints, lost time per save, extra
//!   peak RSS.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};

// `wait4`: a child's exit status, peak RSS and CPU time.
#[path = "bench_report/process.rs"]
mod process;
use process::wait_sampled;

/// Flags.
#[derive(Parser, Debug)]
#[command(about = "The memory tier's training cost and recovery times")]
struct Args {
    /// The trainer binary.
    #[arg(long, default_value = "target/release/examples/train")]
    train: PathBuf,
    /// Where the report goes.
    #[arg(long, default_value = "docs/perf")]
    out: PathBuf,
    /// Scratch directory of the disk tier.
    #[arg(long, default_value = "target/memory-tier-bench")]
    scratch: PathBuf,
    /// The node-local directory (tmpfs).
    #[arg(long, default_value = "/dev/shm/burn-ckpt-bench")]
    tier: PathBuf,
    /// State sizes: 10mb, 400mb, 1gb.
    #[arg(long, default_value = "400mb,1gb", value_delimiter = ',')]
    sizes: Vec<String>,
    /// Training steps of each cost run.
    #[arg(long, default_value_t = 30)]
    steps: u64,
    /// The plain Burn program of the learner route.
    #[arg(long, default_value = "target/release/examples/learner_bench")]
    learner: PathBuf,
    /// Skip the learner route (the trainer's runs only).
    #[arg(long)]
    no_learner: bool,
}

/// `(layers - 1) * hidden^2` parameters, times 12 bytes (weights and AdamW's two moments).
fn shape(label: &str) -> Result<(u32, u32)> {
    Ok(match label {
        "10mb" => (512, 4),
        "400mb" => (4096, 3),
        "1gb" => (4096, 6),
        other => bail!("unknown size {other} (10mb, 400mb, 1gb)"),
    })
}

/// One trainer process.
struct Run {
    wall_s: f64,
    peak_rss: u64,
    /// Peak resident set + tmpfs growth (the memory tier's own frames and the disk tier's
    /// scratch files among it): [`process::Exit::peak_mem`].
    peak_mem: u64,
    /// CPU seconds, user and kernel, all threads.
    cpu_s: f64,
    report: Value,
}

impl Run {
    fn final_wait(&self) -> f64 {
        self.report["lost"]["final_wait_ms"].as_f64().unwrap_or(0.0) / 1e3
    }
    fn disk_saves(&self) -> Vec<u64> {
        self.report["saves"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["step"].as_u64()).collect())
            .unwrap_or_default()
    }
    /// Each disk save's stall on rank 0's training thread (ms), as the library measured it.
    fn disk_stalls(&self) -> Vec<f64> {
        self.report["saves"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["stall_ms"].as_f64()).collect())
            .unwrap_or_default()
    }
    /// Each memory save's stall on rank 0's training thread (ms), as the library measured it.
    fn memory_stalls(&self) -> Vec<f64> {
        self.report["memory_tier"]["stall_ms"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    }
    fn memory_saves(&self) -> Vec<u64> {
        self.report["memory_tier"]["saved"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    }
}

/// The flags every run shares: the model of `label`, `steps` steps, 4 ranks on 2 nodes.
fn common(label: &str, root: &Path, steps: u64) -> Result<Vec<String>> {
    let (hidden, layers) = shape(label)?;
    let flags = [
        "--dir".to_string(),
        root.display().to_string(),
        "--hidden".into(),
        hidden.to_string(),
        "--layers".into(),
        layers.to_string(),
        "--steps".into(),
        steps.to_string(),
        "--ranks".into(),
        "4".into(),
        "--replicate-data".into(),
        "--shard-format".into(),
        "per-rank".into(),
        "--ranks-per-node".into(),
        "2".into(),
        "--keep-last".into(),
        "2".into(),
    ];
    Ok(flags.to_vec())
}

/// The tier's flags: a save at most every `every` steps, under `budget` (`off`: none).
fn tier_flags(args: &Args, every: u64, budget: &str) -> Vec<String> {
    vec![
        "--memory-tier".into(),
        format!("{}/node-{{node}}", args.tier.display()),
        "--memory-every".into(),
        every.to_string(),
        "--memory-budget".into(),
        budget.into(),
    ]
}

/// Runs the trainer to the end; its report and peak RSS.
fn run(args: &Args, name: &str, flags: &[String], env: &[(&str, String)]) -> Result<Run> {
    run_bin(&args.train, args, name, flags, env)
}

/// Runs `bin` (the trainer or `learner_bench`) with `--report` to the end; its report and
/// peak RSS.
fn run_bin(
    bin: &Path,
    args: &Args,
    name: &str,
    flags: &[String],
    env: &[(&str, String)],
) -> Result<Run> {
    let report_path = args.scratch.join(format!("{name}.json"));
    let log_path = args.scratch.join(format!("{name}.log"));
    let log = File::create(&log_path)?;
    let child = Command::new(bin)
        .args(flags)
        .arg("--report")
        .arg(&report_path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let t0 = Instant::now();
    let exit = wait_sampled(child.id())?;
    let (status, peak_rss) = (exit.code, exit.peak_rss);
    let elapsed = t0.elapsed().as_secs_f64();
    if status != 0 {
        bail!("{name} exited with {status}: see {}", log_path.display());
    }
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path)?)?;
    Ok(Run {
        wall_s: report["wall_s"].as_f64().unwrap_or(elapsed),
        peak_rss,
        peak_mem: exit.peak_mem,
        cpu_s: exit.cpu_s,
        report,
    })
}

/// Starts the trainer and returns the seconds to its first `step N/M` line and N; then kills it.
fn time_to_first_step(args: &Args, flags: &[String], env: &[(&str, String)]) -> Result<(f64, u64)> {
    let t0 = Instant::now();
    let mut child = Command::new(&args.train)
        .args(flags)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().context("piped stderr")?;
    let mut log = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("step ")
            && let Some(n) = rest.split('/').next().and_then(|n| n.parse::<u64>().ok())
        {
            let secs = t0.elapsed().as_secs_f64();
            let _ = child.kill();
            let _ = child.wait();
            return Ok((secs, n));
        }
        log.push(line);
    }
    let _ = child.wait();
    bail!("no training step:\n{}", log.join("\n"))
}

/// Mean steps lost by a failure at a uniformly random step of `1..=steps`: the steps since
/// the newest of `saved` before it (0 when none).
fn mean_work_lost(saved: &[u64], steps: u64) -> f64 {
    let lost: u64 = (1..=steps)
        .map(|t| t - saved.iter().copied().filter(|&s| s < t).max().unwrap_or(0))
        .sum();
    lost as f64 / steps as f64
}

/// Bytes under `dir` (files only).
fn du(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                du(&p)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}

/// Copies a directory tree.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let status = Command::new("cp").arg("-a").arg(from).arg(to).status()?;
    if !status.success() {
        bail!("cp -a {} {} failed", from.display(), to.display());
    }
    Ok(())
}

/// Evicts every file under `dir` from the page cache (`posix_fadvise(DONTNEED)`; the pages are
/// clean: the checkpoint was fsynced).
fn evict(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            evict(&p)?;
        } else {
            let f = File::open(&p)?;
            // SAFETY: a valid open descriptor; advice only.
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                    0,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
    }
    Ok(())
}

fn reset(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.scratch)?;
    std::fs::create_dir_all(&args.out)?;
    let moto = test_support::s3::Moto::start();
    let s3 = test_support::s3::s3_env(&moto.endpoint());
    let bucket = test_support::s3::BUCKET;
    let mut sizes = Vec::new();
    for label in args.sizes.clone() {
        eprintln!("== {label}");
        let root = args.scratch.join(format!("{label}-root"));
        let steps = args.steps;
        let base_flags = common(&label, &root, steps)?;
        let mut cost = Vec::new();
        let memory = |every: u64, budget: &str| {
            let mut v = vec!["--save-every".into(), "1000000".into()];
            v.extend(tier_flags(&args, every, budget));
            v
        };
        let modes: [(&str, Vec<String>); 6] = [
            ("none", vec!["--save-every".into(), "0".into()]),
            ("disk-10", vec!["--save-every".into(), "10".into()]),
            ("memory-1", memory(1, "0.05")),
            ("memory-1 budget off", memory(1, "off")),
            ("memory-10", memory(10, "0.05")),
            ("none-again", vec!["--save-every".into(), "0".into()]),
        ];
        for (mode, extra) in &modes {
            reset(&root);
            reset(&args.tier);
            let flags: Vec<String> = base_flags.iter().chain(extra).cloned().collect();
            let name = format!("{label}-{}", mode.replace(' ', "-"));
            let r = run(&args, &name, &flags, &[])?;
            eprintln!("  {mode}: {:.1} s", r.wall_s);
            cost.push((mode.to_string(), r));
        }
        let last = cost.len() - 1;
        let base = (cost[0].1.wall_s + cost[last].1.wall_s) / 2.0;
        let noise = (cost[0].1.wall_s - cost[last].1.wall_s).abs();
        let state_bytes = cost[1].1.report["saves"][0]["bytes"].as_u64().unwrap_or(0);
        let base_rss = (cost[0].1.peak_rss + cost[last].1.peak_rss) as f64 / 2.0;
        let mut rows = Vec::new();
        for (mode, r) in &cost[1..last] {
            let (saves, work_lost) = if mode.starts_with("memory") {
                let m = r.memory_saves();
                (m.len(), mean_work_lost(&m, steps))
            } else {
                let d = r.disk_saves();
                (d.len().saturating_sub(1), mean_work_lost(&d, steps))
            };
            let lost = r.wall_s - base - r.final_wait();
            let stall = if mode.starts_with("memory") {
                median(r.memory_stalls())
            } else {
                median(r.disk_stalls())
            };
            rows.push(json!({
                "median_stall_ms": stall,
                "extra_peak_rss": r.peak_rss as f64 - base_rss,
                "mode": mode,
                "wall_s": r.wall_s,
                "saves": saves,
                "skipped": r.report["memory_tier"]["skipped"],
                "throttled": r.report["memory_tier"]["throttled"],
                "tier_measured_lost_s": r.report["memory_tier"]["lost_s"],
                "tier_measured_training_s": r.report["memory_tier"]["training_s"],
                "median_phases_ms": phases(&r.report["memory_tier"]["phases"]),
                "lost_s": lost,
                "lost_per_save_s": lost / saves.max(1) as f64,
                "mean_steps_lost_per_failure": work_lost,
                "median_memory_save_ms": median(r.report["memory_tier"]["save_ms"].as_array()
                    .map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()),
                "peak_rss": r.peak_rss,
                "peak_mem": r.peak_mem,
                "cpu_s": r.cpu_s,
                "tier_peak_bytes_rank0": r.report["memory_tier"]["peak_bytes"],
            }));
        }

        // Recovery: one killed run, restarted four ways from copies.
        let kill_at = 15;
        reset(&root);
        reset(&args.tier);
        let prefix = format!("s3://{bucket}/{label}-{}", std::process::id());
        let mut flags: Vec<String> = common(&label, &root, 20)?;
        flags.extend([
            "--save-every".into(),
            "10".into(),
            "--upload-to".into(),
            prefix.clone(),
        ]);
        flags.extend(tier_flags(&args, 1, "off"));
        let killed = Command::new(&args.train)
            .args(&flags)
            .args(["--abort-at-step", &kill_at.to_string()])
            .envs(s3.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(
                args.scratch.join(format!("{label}-killed.log")),
            )?)
            .status()?;
        if std::os::unix::process::ExitStatusExt::signal(&killed) != Some(libc::SIGABRT) {
            bail!(
                "the run to kill did not abort ({killed}): see {}",
                args.scratch.join(format!("{label}-killed.log")).display()
            );
        }
        let tier_bytes = du(&args.tier);
        let saved_root = args.scratch.join(format!("{label}-root-saved"));
        let saved_tier = args.scratch.join(format!("{label}-tier-saved"));
        reset(&saved_root);
        reset(&saved_tier);
        copy_tree(&root, &saved_root)?;
        let tier_copy = args.tier.with_extension("saved");
        reset(&tier_copy);
        copy_tree(&args.tier, &tier_copy)?;
        let restore = |wipe: &dyn Fn() -> Result<()>, with_tier: bool| -> Result<(f64, u64)> {
            reset(&root);
            reset(&args.tier);
            copy_tree(&saved_root, &root)?;
            copy_tree(&tier_copy, &args.tier)?;
            wipe()?;
            let mut f: Vec<String> = common(&label, &root, 20)?;
            f.extend(["--save-every".into(), "10".into(), "--resume".into()]);
            f.extend(["--upload-to".into(), prefix.clone()]);
            if with_tier {
                f.extend(tier_flags(&args, 1, "off"));
            }
            time_to_first_step(&args, &f, &s3)
        };
        let own = restore(&|| Ok(()), true)?;
        let peer = restore(
            &|| {
                std::fs::remove_dir_all(args.tier.join("node-1"))?;
                Ok(())
            },
            true,
        )?;
        let disk = restore(&|| evict(&root), false)?;
        let remote = restore(
            &|| {
                std::fs::remove_dir_all(&root)?;
                std::fs::remove_dir_all(&args.tier)?;
                Ok(())
            },
            false,
        )?;
        reset(&tier_copy);
        reset(&saved_root);
        reset(&root);
        reset(&args.tier);
        let recovery = json!({
            "killed_at": kill_at,
            "own_memory": {"s": own.0, "first_step": own.1},
            "peer_replicas": {"s": peer.0, "first_step": peer.1},
            "disk": {"s": disk.0, "first_step": disk.1},
            "object_store": {"s": remote.0, "first_step": remote.1},
            "tier_bytes_all_nodes": tier_bytes,
        });
        eprintln!("  recovery: {recovery}");
        let learner = if args.no_learner {
            Value::Null
        } else {
            learner_route(&args, &label)?
        };
        sizes.push(json!({
            "size": label,
            "state_bytes": state_bytes,
            "steps": steps,
            "baseline_wall_s": base,
            "baseline_spread_s": noise,
            "baseline_peak_rss": base_rss,
            "cost": rows,
            "recovery": recovery,
            "learner": learner,
        }));
    }
    let out = json!({ "sizes": sizes });
    std::fs::write(
        args.out.join("memory_tier.json"),
        serde_json::to_string_pretty(&out)?,
    )?;
    std::fs::write(args.out.join("MEMORY_TIER.md"), markdown(&out))?;
    eprintln!("wrote {}", args.out.join("MEMORY_TIER.md").display());
    Ok(())
}

/// `learner_bench`'s shape of `label`: its `layers * hidden^2` parameters are the trainer's
/// `(layers - 1) * hidden^2`.
fn learner_shape(label: &str) -> Result<(u32, u32)> {
    let (hidden, layers) = shape(label)?;
    Ok((hidden, layers - 1))
}

/// The step gap spanning step `s` (1-based): from its start to the next step's.
fn gap_after(r: &Run, s: u64) -> Option<f64> {
    let t = r.report["step_starts_s"].as_array()?;
    let s = usize::try_from(s).ok()?;
    Some(t.get(s)?.as_f64()? - t.get(s.checked_sub(1)?)?.as_f64()?)
}

/// The median over `steps` of the step gap spanning each, less the median gap of `bases` at
/// that step (s); `NaN` without any.
fn gap_stall(r: &Run, bases: &[&Run], steps: &[u64]) -> f64 {
    let mut v = Vec::new();
    for &s in steps {
        let (Some(gap), base) = (
            gap_after(r, s),
            median(bases.iter().filter_map(|b| gap_after(b, s)).collect()),
        ) else {
            continue;
        };
        if base.is_finite() {
            v.push(gap - base);
        }
    }
    median(v)
}

/// Burn's learner route (`learner_bench`, a plain `SupervisedTraining` program): ZeRO-1 on 4
/// rank threads (`ZeroTrainingStrategy`) without checkpoints (twice), with a disk save every
/// `EPOCH` steps, and with the memory tier of the docs' learner lines besides (a save due every
/// step, under the default budget and with it off); and on one device, Burn's own
/// checkpointer against no checkpoints, saving at the same steps.
fn learner_route(args: &Args, label: &str) -> Result<Value> {
    const EPOCH: u64 = 10;
    const EPOCHS: u64 = 3;
    let (hidden, layers) = learner_shape(label)?;
    let dir = args.scratch.join(format!("{label}-learner"));
    let flags = |mode: &str, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--mode",
            mode,
            "--hidden",
            &hidden.to_string(),
            "--layers",
            &layers.to_string(),
            "--epochs",
            &EPOCHS.to_string(),
            "--steps-per-epoch",
            &EPOCH.to_string(),
            "--dir",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let tier = format!("{}/node-{{node}}", args.tier.display());
    let memory = |budget: &'static str| {
        vec![
            "--ranks",
            "4",
            "--memory-tier",
            &tier,
            "--memory-every",
            "1",
            "--memory-budget",
            budget,
            "--ranks-per-node",
            "2",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let runs: Vec<(&str, Vec<String>)> = vec![
        ("zero, no checkpoints", flags("zero-off", &["--ranks", "4"])),
        ("zero, disk", flags("zero", &["--ranks", "4"])),
        ("zero, disk + memory every step", {
            let m = memory("0.05");
            flags("zero", &m.iter().map(String::as_str).collect::<Vec<_>>())
        }),
        ("zero, disk + memory every step, budget off", {
            let m = memory("off");
            flags("zero", &m.iter().map(String::as_str).collect::<Vec<_>>())
        }),
        (
            "zero, no checkpoints (again)",
            flags("zero-off", &["--ranks", "4"]),
        ),
        ("1 device, no checkpoints", flags("off", &[])),
        ("1 device, Burn's checkpointer", flags("burn", &[])),
    ];
    let mut done = Vec::new();
    for (mode, f) in &runs {
        reset(&args.tier);
        let name = format!("{label}-learner-{}", mode.replace([' ', ',', '\''], "-"));
        let r = run_bin(&args.learner, args, &name, f, &[])?;
        eprintln!("  learner, {mode}: {:.1} s", r.wall_s);
        done.push((*mode, r));
    }
    reset(&args.tier);
    let find = |m: &str| done.iter().find(|(k, _)| *k == m).map(|(_, r)| r);
    let (Some(off_a), Some(off_b), Some(disk), Some(one_off)) = (
        find("zero, no checkpoints"),
        find("zero, no checkpoints (again)"),
        find("zero, disk"),
        find("1 device, no checkpoints"),
    ) else {
        bail!("a learner run is missing");
    };
    let zero_base = (off_a.wall_s + off_b.wall_s) / 2.0;
    let zero_rss = (off_a.peak_rss + off_b.peak_rss) as f64 / 2.0;
    let disk_steps: Vec<u64> = (1..=EPOCHS).map(|e| e * EPOCH).collect();
    let state_bytes = off_a.report["state_bytes"].as_u64().unwrap_or(0);
    let mut rows = Vec::new();
    for (mode, r) in &done {
        if mode.contains("no checkpoints") {
            continue;
        }
        let one_device = mode.starts_with("1 device");
        let (bases, base_wall, base_rss): (Vec<&Run>, f64, f64) = if one_device {
            (vec![one_off], one_off.wall_s, one_off.peak_rss as f64)
        } else {
            (vec![off_a, off_b], zero_base, zero_rss)
        };
        let memory_saves = r.memory_saves();
        let mut row = json!({
            "mode": mode,
            "wall_s": r.wall_s,
            "disk_saves": disk_steps.len(),
            "disk_stall_s": gap_stall(r, &bases, &disk_steps),
            "extra_peak_rss": r.peak_rss as f64 - base_rss,
            "peak_rss": r.peak_rss,
        });
        if memory_saves.is_empty() {
            row["lost_per_disk_save_s"] = json!((r.wall_s - base_wall) / disk_steps.len() as f64);
            row["steps_lost_per_failure"] = json!(mean_work_lost(&disk_steps, EPOCH * EPOCHS));
        } else {
            // The memory saves at steps without a disk save: their gaps are the tier's alone.
            let only: Vec<u64> = memory_saves
                .iter()
                .copied()
                .filter(|s| !disk_steps.contains(s))
                .collect();
            let tier = &r.report["memory_tier"];
            row["memory_saves"] = json!(memory_saves.len());
            row["memory_stall_s"] = json!(gap_stall(r, &bases, &only));
            row["memory_stall_library_ms"] = json!(median(r.memory_stalls()));
            // Over the same run with disk saves only: what the tier adds.
            row["lost_per_memory_save_s"] =
                json!((r.wall_s - disk.wall_s) / memory_saves.len() as f64);
            row["skipped"] = tier["skipped"].clone();
            row["throttled"] = tier["throttled"].clone();
            row["tier_measured_lost_s"] = tier["lost_s"].clone();
            row["tier_measured_training_s"] = tier["training_s"].clone();
            let either: Vec<u64> = memory_saves.iter().chain(&disk_steps).copied().collect();
            row["steps_lost_per_failure"] = json!(mean_work_lost(&either, EPOCH * EPOCHS));
        }
        rows.push(row);
    }
    Ok(json!({
        "state_bytes": state_bytes,
        "steps": EPOCH * EPOCHS,
        "disk_every": EPOCH,
        "zero_baseline_wall_s": zero_base,
        "zero_baseline_spread_s": (off_a.wall_s - off_b.wall_s).abs(),
        "zero_baseline_peak_rss": zero_rss,
        "one_device_baseline_wall_s": one_off.wall_s,
        "one_device_baseline_peak_rss": one_off.peak_rss,
        "rows": rows,
    }))
}

/// The median of each phase over a run's memory saves (`SavePhases` as JSON).
fn phases(list: &Value) -> Value {
    let of = |k: &str| {
        median(
            list.as_array()
                .map(|a| a.iter().filter_map(|p| p[k].as_f64()).collect())
                .unwrap_or_default(),
        )
    };
    let keys = ["own_ms", "read_ms", "exchange_ms", "replica_ms", "agree_ms"];
    Value::Object(
        keys.iter()
            .filter(|k| of(k).is_finite())
            .map(|k| (k.to_string(), json!(of(k))))
            .collect(),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn markdown(out: &Value) -> String {
    let mut s = String::from(
        "# The memory tier: cost and recovery\n\n\
         `target/release/examples/memory_tier_bench` (see its doc comment): the example trainer \
         on 4 ZeRO-1 rank threads as 2 simulated nodes (2 ranks each), per-rank shards, tier \
         on `/dev/shm`, on this 2-core machine. Lost time is wall time over the mean of two \
         runs without checkpoints, less the wait for the final save. Work lost per failure: \
         mean steps since the newest save before a failure at a uniformly random step.\n\n",
    );
    for z in out["sizes"].as_array().into_iter().flatten() {
        let state = z["state_bytes"].as_f64().unwrap_or(0.0) / 1e6;
        s.push_str(&format!(
            "## {} ({state:.0} MB of state, {} steps)\n\nRuns without checkpoints: {:.1} s \
             (the two differ by {:.1} s).\n\n\
             | run | saves (memory: whole) | skipped (busy / budget) | stall per save | lost per \
             save | tier's own account | steps lost per failure | median memory save | peak RSS \
             (extra) |\n\
             |---|---|---|---|---|---|---|---|---|\n",
            z["size"].as_str().unwrap_or(""),
            z["steps"],
            z["baseline_wall_s"].as_f64().unwrap_or(0.0),
            z["baseline_spread_s"].as_f64().unwrap_or(0.0),
        ));
        for r in z["cost"].as_array().into_iter().flatten() {
            let account = match (
                r["tier_measured_lost_s"].as_f64(),
                r["tier_measured_training_s"].as_f64(),
            ) {
                (Some(l), Some(t)) if t > 0.0 => format!("{:.1} %", 100.0 * l / t),
                _ => "-".into(),
            };
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} s | {account} | {:.1} | {} | {:.2} GB ({:+.2} GB, \
                 {:.2}x the state) |\n",
                r["mode"].as_str().unwrap_or(""),
                r["saves"],
                match (r["skipped"].as_u64(), r["throttled"].as_u64()) {
                    (Some(a), Some(b)) => format!("{a} / {b}"),
                    _ => "-".into(),
                },
                r["median_stall_ms"]
                    .as_f64()
                    .filter(|v| v.is_finite())
                    .map_or("-".into(), |v| format!("{v:.2} ms")),
                r["lost_per_save_s"].as_f64().unwrap_or(f64::NAN),
                r["mean_steps_lost_per_failure"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                r["median_memory_save_ms"]
                    .as_f64()
                    .filter(|v| v.is_finite())
                    .map_or("-".into(), |v| format!("{v:.0} ms")),
                r["peak_rss"].as_f64().unwrap_or(0.0) / 1e9,
                r["extra_peak_rss"].as_f64().unwrap_or(f64::NAN) / 1e9,
                r["extra_peak_rss"].as_f64().unwrap_or(f64::NAN) / (state * 1e6).max(1.0),
            ));
        }
        s.push_str(
            "\nStall per save: the median time a save held rank 0's training thread, as the \
             library measured it (a memory save: the ranks' agreement to save, the part's \
             capture, the hand-off; a disk save: the session's stall). Peak RSS of the process \
             (all 4 ranks), extra over the mean of the two runs without checkpoints.\n",
        );
        s.push_str(
            "\nThe tier's own account: what its saves cost training as the trainer measures it \
             (stall plus the excess over the baseline step time of the steps a save ran in and \
             one after), over the training time, on rank 0; the budget (5 % by default) is held \
             against it. Median phases of a memory save on rank 0 (ms):\n\n\
             | run | own part | read back | exchange | replicas | agreement |\n\
             |---|---|---|---|---|---|\n",
        );
        for r in z["cost"].as_array().into_iter().flatten() {
            let p = &r["median_phases_ms"];
            if p.as_object().is_none_or(|o| o.is_empty()) {
                continue;
            }
            let f = |k: &str| p[k].as_f64().map_or("-".into(), |v| format!("{v:.0}"));
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                r["mode"].as_str().unwrap_or(""),
                f("own_ms"),
                f("read_ms"),
                f("exchange_ms"),
                f("replica_ms"),
                f("agree_ms")
            ));
        }
        let rc = &z["recovery"];
        s.push_str(&format!(
            "\nRecovery after a run killed at step {} (memory save every step, disk every 10, \
             uploads to a local S3 server); the tier held {:.2} GB on `/dev/shm` (all nodes).\n\n\
             | restart from | to the first step | resumed at step |\n|---|---|---|\n",
            rc["killed_at"],
            rc["tier_bytes_all_nodes"].as_f64().unwrap_or(0.0) / 1e9
        ));
        for (k, name) in [
            ("own_memory", "each rank's own memory tier"),
            ("peer_replicas", "peers' replicas (node 1 wiped)"),
            ("disk", "disk (pages evicted with fadvise)"),
            ("object_store", "object store (local copies gone)"),
        ] {
            s.push_str(&format!(
                "| {name} | {:.2} s | {} |\n",
                rc[k]["s"].as_f64().unwrap_or(f64::NAN),
                rc[k]["first_step"]
                    .as_u64()
                    .map_or(0, |n| n.saturating_sub(1))
            ));
        }
        learner_markdown(&mut s, &z["learner"]);
        s.push('\n');
    }
    s
}

/// The learner route's table of one size.
fn learner_markdown(s: &mut String, l: &Value) {
    if l.is_null() {
        return;
    }
    let state = l["state_bytes"].as_f64().unwrap_or(0.0);
    let gb = |v: &Value| v.as_f64().unwrap_or(f64::NAN) / 1e9;
    let secs = |v: &Value| {
        v.as_f64()
            .filter(|v| v.is_finite())
            .map_or("-".into(), |v| format!("{v:.2} s"))
    };
    s.push_str(&format!(
        "\n### Burn's learner route ({:.0} MB of state, {} steps, a disk save every {})\n\n\
         `learner_bench`: a plain `SupervisedTraining` program; ZeRO-1 through \
         `ZeroTrainingStrategy` on 4 rank threads (2 simulated nodes), the memory tier as \
         `docs/memory-tier.md`'s learner lines give it, a save due every step. Runs of the \
         same ranks without checkpoints: {:.1} s (the two differ by {:.1} s), peak RSS {:.2} GB; \
         one device without checkpoints: {:.1} s, {:.2} GB.\n\n\
         | run | disk saves | disk stall | lost per disk save | memory saves (whole) | skipped \
         (busy / budget) | memory stall (gaps / library) | lost per memory save | tier's own \
         account | steps lost per failure | extra peak RSS |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        state / 1e6,
        l["steps"],
        l["disk_every"],
        l["zero_baseline_wall_s"].as_f64().unwrap_or(f64::NAN),
        l["zero_baseline_spread_s"].as_f64().unwrap_or(f64::NAN),
        gb(&l["zero_baseline_peak_rss"]),
        l["one_device_baseline_wall_s"].as_f64().unwrap_or(f64::NAN),
        gb(&l["one_device_baseline_peak_rss"]),
    ));
    for r in l["rows"].as_array().into_iter().flatten() {
        let memory = r.get("memory_saves").is_some();
        let account = match (
            r["tier_measured_lost_s"].as_f64(),
            r["tier_measured_training_s"].as_f64(),
        ) {
            (Some(a), Some(t)) if t > 0.0 => format!("{:.1} %", 100.0 * a / t),
            _ if memory => "unmeasured".into(),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {account} | {:.1} | {:+.2} GB ({:.2}x) |\n",
            r["mode"].as_str().unwrap_or(""),
            r["disk_saves"],
            secs(&r["disk_stall_s"]),
            secs(&r["lost_per_disk_save_s"]),
            if memory {
                r["memory_saves"].to_string()
            } else {
                "-".into()
            },
            match (r["skipped"].as_u64(), r["throttled"].as_u64()) {
                (Some(a), Some(b)) => format!("{a} / {b}"),
                _ => "-".into(),
            },
            if memory {
                format!(
                    "{} / {}",
                    secs(&r["memory_stall_s"]),
                    r["memory_stall_library_ms"]
                        .as_f64()
                        .filter(|v| v.is_finite())
                        .map_or("-".into(), |v| format!("{v:.2} ms"))
                )
            } else {
                "-".into()
            },
            secs(&r["lost_per_memory_save_s"]),
            r["steps_lost_per_failure"].as_f64().unwrap_or(f64::NAN),
            gb(&r["extra_peak_rss"]),
            r["extra_peak_rss"].as_f64().unwrap_or(f64::NAN) / state.max(1.0),
        ));
    }
    s.push_str(
        "\nDisk and memory stall (gaps): the gap from the start of a saved step to the next \
         step's start, less the median gap of the runs without checkpoints at that step, median \
         over the saves (memory: at steps without a disk save; a disk save at the last step has \
         no next step). The library's: the median time a memory save held rank 0's training \
         thread. Lost per disk save: wall time over the runs without checkpoints, over the disk \
         saves; lost per memory save: wall time over the run with disk saves only, over the \
         memory saves. Extra peak RSS: over the runs without checkpoints (one device: its own), \
         and as a multiple of the state.\n",
    );
}
