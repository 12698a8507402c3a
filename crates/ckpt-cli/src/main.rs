//! `ckpt`: list, verify, inspect, export and clean up burn-ckpt checkpoints.
//!
//! Exit status: 0 on success; 1 when something fails verification or an operation fails (one
//! line on stderr naming the file and the reason); 2 on bad usage.

mod export;
mod inspect;
mod nested;
mod remote;
mod rewound;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ckpt_core::{
    CheckpointStatus, Retention, RootLock, garbage_collect,
    layout::{MANIFEST_FILE, parse_step_dir},
    list_checkpoints, prune, read_latest, verify_checkpoint,
};
use clap::{Parser, Subcommand, ValueEnum};

/// Inspect and maintain burn-ckpt checkpoint directories.
#[derive(Parser)]
#[command(name = "ckpt", version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the checkpoints in ROOT (sizes checked, checksums not).
    Ls {
        /// Checkpoint root, or an object-store prefix (s3://bucket/prefix).
        root: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Verify every file of every checkpoint in ROOT, or of one checkpoint directory.
    Verify {
        /// A checkpoint root or one `step-*` directory (local, or s3://bucket/prefix[/step-*]).
        path: PathBuf,
    },
    /// Show what one checkpoint holds: every file's tensors (name, dtype, shape, bytes),
    /// scalars and metadata, and the trainer state (step, epoch, data cursor, seeds).
    Inspect {
        /// A checkpoint directory (`ROOT/step-*`, or s3://bucket/prefix/step-*).
        ckpt: PathBuf,
        /// Print JSON (with each tensor's first values) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write a checkpoint's model tensors (and optionally its optimizer's) to another format.
    Export {
        /// A checkpoint directory (`ROOT/step-*`, or s3://bucket/prefix/step-*).
        ckpt: PathBuf,
        /// Output format.
        #[arg(long, value_enum)]
        to: Format,
        /// Output file.
        out: PathBuf,
        /// Also export the optimizer state, with names prefixed `optim.`.
        #[arg(long)]
        with_optim: bool,
    },
    /// Remove stale in-flight data, quarantined and invalid checkpoints, and optionally apply
    /// retention and remove what rewinds moved aside. Refuses while a trainer holds the root.
    Gc {
        /// Checkpoint root, or an object-store prefix (s3://bucket/prefix).
        root: PathBuf,
        /// Also keep only the newest N valid checkpoints.
        #[arg(long)]
        keep_last: Option<usize>,
        /// Also remove the checkpoints a rewind moved aside (`ROOT/.rewound-*`: the timeline a
        /// run abandoned when it started over or resumed from an earlier step).
        #[arg(long)]
        rewound: bool,
    },
}

/// Export formats.
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// Hugging Face safetensors.
    Safetensors,
}

/// Sends the libraries' events (skipped checkpoints, repairs) to stderr: level `warn` by
/// default, `RUST_LOG` overrides.
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

/// Restores SIGPIPE's default action, which Rust's runtime sets to "ignore": a reader that
/// closes early (`ckpt ls ROOT | head`) then ends this process quietly, as it does `ls`,
/// instead of `println!` panicking with "Broken pipe".
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: `signal` with SIG_DFL installs no handler code; it runs first in `main`, before
    // any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    quiet_on_closed_pipe();
    install_log_subscriber();
    let cli = Cli::parse();
    let url = |p: &Path| p.to_str().filter(|s| remote::is_url(s)).map(str::to_string);
    let res = match cli.cmd {
        Cmd::Ls { root, json } => match url(&root) {
            Some(u) => remote::ls(&u, json),
            None => ls(&root, json),
        },
        Cmd::Verify { path } => match url(&path) {
            Some(u) => remote::verify(&u),
            None => verify(&path),
        },
        Cmd::Inspect { ckpt, json } => match url(&ckpt) {
            Some(u) => remote::inspect(&u, json),
            None => inspect_cmd(&ckpt, json),
        },
        Cmd::Export {
            ckpt,
            to: Format::Safetensors,
            out,
            with_optim,
        } => match url(&ckpt) {
            Some(u) => remote::export(&u, &out, with_optim),
            None => export::to_safetensors(&ckpt, &out, with_optim),
        }
        .map(|n| {
            println!("wrote {n} tensors to {}", out.display());
        }),
        Cmd::Gc {
            root,
            keep_last,
            rewound,
        } => match url(&root) {
            Some(_) if rewound => Err(anyhow::anyhow!(
                "--rewound: {} is an object-store prefix; rewinds move only local checkpoints \
                 aside (ROOT/.rewound-*)",
                root.display()
            )),
            Some(u) => remote::gc(&u, keep_last),
            None => gc(&root, keep_last, rewound),
        },
    };
    if let Err(e) = res {
        eprintln!("ckpt: {e:#}");
        std::process::exit(1);
    }
}

fn require_dir(p: &Path) -> Result<()> {
    if !p.is_dir() {
        bail!("{}: not a directory", p.display());
    }
    Ok(())
}

fn inspect_cmd(ckpt: &Path, json: bool) -> Result<()> {
    let i = inspect::inspect(ckpt)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&inspect::to_json(&i))?);
    } else {
        print!("{}", inspect::to_text(&i));
    }
    Ok(())
}

fn human(bytes: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn ls(root: &Path, json: bool) -> Result<()> {
    require_dir(root)?;
    let list = list_checkpoints(root, false)?;
    let aside = rewound::list(root)?;
    if json {
        let rows: Vec<_> = list
            .iter()
            .map(|c| {
                let by_epoch = c.manifest.as_ref().is_some_and(|m| m.keyed_by_epoch());
                serde_json::json!({
                    // A checkpoint keyed by Burn's epoch number has no step.
                    "step": (!by_epoch).then_some(c.step),
                    "keyed_by": if by_epoch { "epoch" } else { "step" },
                    "path": c.path,
                    "bytes": c.bytes,
                    "latest": c.latest,
                    "epoch": c.manifest.as_ref().map(|m| m.epoch),
                    "world_size": c.manifest.as_ref().map(|m| m.world_size),
                    "layout": c.manifest.as_ref().map(|m| m.layout.clone()),
                    "files": c.manifest.as_ref().map(|m| m.files.iter().map(|f| &f.name).collect::<Vec<_>>()),
                    "valid": !matches!(c.status, CheckpointStatus::Invalid(_)),
                    "problem": match &c.status { CheckpointStatus::Invalid(r) => Some(r), _ => None },
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        // Stdout stays one JSON document.
        if list.is_empty()
            && let Some(note) = nested::note_below(root)
        {
            eprintln!("note: no checkpoints in {}; {note}", root.display());
        }
        if let Some(note) = rewound::note(&aside) {
            eprintln!("{note}");
        }
        return Ok(());
    }
    if list.is_empty() {
        println!("no checkpoints in {}", root.display());
        if let Some(note) = nested::note_below(root) {
            println!("note: {note}");
        }
        if let Some(note) = rewound::note(&aside) {
            println!("{note}");
        }
        return Ok(());
    }
    println!(
        "{:<16} {:>10} {:>6} {:>10} {:>6}  STATUS",
        "NAME", "STEP", "EPOCH", "SIZE", "FILES"
    );
    for c in &list {
        let name = c
            .path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let (epoch, files) = c
            .manifest
            .as_ref()
            .map(|m| (m.epoch.to_string(), m.files.len().to_string()))
            .unwrap_or(("-".into(), "-".into()));
        let status = match &c.status {
            CheckpointStatus::Invalid(r) => format!("INVALID: {r}"),
            _ if c.latest => "ok (latest)".into(),
            _ => "ok".into(),
        };
        // Burn's epoch loop keys its checkpoints by epoch: no step to show.
        let by_epoch = c.manifest.as_ref().is_some_and(|m| m.keyed_by_epoch());
        let step = if by_epoch {
            "-".to_string()
        } else {
            c.step.to_string()
        };
        let status = if by_epoch {
            format!("{status}, keyed by epoch")
        } else {
            status
        };
        println!(
            "{name:<16} {step:>10} {epoch:>6} {:>10} {files:>6}  {status}",
            human(c.bytes)
        );
    }
    if let Some(note) = rewound::note(&aside) {
        println!("{note}");
    }
    Ok(())
}

fn verify(path: &Path) -> Result<()> {
    require_dir(path)?;
    let is_ckpt = path.join(MANIFEST_FILE).exists()
        || path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_step_dir)
            .is_some();
    if is_ckpt {
        let m = verify_checkpoint(path)?;
        println!(
            "OK   {} (step {}, {} files, {})",
            path.display(),
            m.step,
            m.files.len(),
            human(m.total_bytes())
        );
        return Ok(());
    }
    let list = list_checkpoints(path, true)?;
    if list.is_empty() {
        // Verifying nothing is not a success: the path is most likely not the root meant.
        let below = nested::note_below(path)
            .map(|n| format!("; {n}"))
            .unwrap_or_default();
        bail!(
            "no checkpoints in {}: nothing to verify{below}",
            path.display()
        );
    }
    let mut failures = 0;
    for c in &list {
        match &c.status {
            CheckpointStatus::Invalid(r) => {
                failures += 1;
                eprintln!("FAIL {r}");
            }
            _ => println!("OK   {} ({})", c.path.display(), human(c.bytes)),
        }
    }
    let latest =
        read_latest(path).with_context(|| format!("{}: cannot read `latest`", path.display()))?;
    match latest {
        Some(name) => {
            let ok = list
                .iter()
                .any(|c| c.latest && !matches!(c.status, CheckpointStatus::Invalid(_)));
            if !ok {
                failures += 1;
                eprintln!(
                    "FAIL {}: names {name}, which is not a valid checkpoint",
                    path.join("latest").display()
                );
            }
        }
        None if !list.is_empty() => {
            // A crash right after the first publish; not a damaged checkpoint.
            eprintln!(
                "note: {} is missing (a crash right after the first publish); the next start \
                 names the newest valid checkpoint",
                path.join("latest").display()
            );
        }
        None => {}
    }
    if failures > 0 {
        bail!("{failures} problem(s) in {}", path.display());
    }
    println!(
        "{} checkpoint(s) verified in {}",
        list.len(),
        path.display()
    );
    Ok(())
}

fn gc(root: &Path, keep_last: Option<usize>, remove_rewound: bool) -> Result<()> {
    require_dir(root)?;
    let _lock = RootLock::acquire(root)?;
    for p in garbage_collect(root)? {
        println!("removed {}", p.display());
    }
    if let Some(n) = keep_last {
        for s in prune(root, &Retention::keep_last(n))? {
            println!("removed step {s} (retention)");
        }
    }
    let aside = rewound::list(root)?;
    if remove_rewound {
        for p in rewound::remove(root, aside)? {
            println!("removed {} (rewound)", p.display());
        }
    } else if let Some(note) = rewound::note(&aside) {
        println!("{note}");
    }
    Ok(())
}
