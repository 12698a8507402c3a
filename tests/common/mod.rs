//! Shared helpers of the reliability tests (`tests/reliability_*.rs`).
//!
//! The example trainer (`examples/train.rs`) is compiled into each test binary as a module, so
//! its real code (flags, signal handling, exit statuses, messages) runs in child processes: a
//! test re-executes its own binary with the trainer's arguments in [`CHILD_ARGS`], and the
//! `child_entry` test of that binary hands them to the example's `cli`. Children are separate
//! processes because the backend RNG is process-global and because signals and `SIGKILL` must
//! hit a whole trainer, its persist thread included.

#![allow(dead_code)]

#[path = "../../examples/train.rs"]
mod train_cli;

use std::{
    ffi::OsString,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use burn_ckpt::ckpt_burn::{MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE};
use burn_ckpt::ckpt_core;

/// `ROOT/step-<step:08>`, and the `.tmp*` entries left in a root (not every test binary uses
/// both).
#[allow(unused_imports)]
pub(crate) use test_support::fs::{step_dir, tmp_entries};

/// Environment variable carrying the trainer's arguments, one per line.
pub(crate) const CHILD_ARGS: &str = "BURN_CKPT_RELIABILITY_ARGS";
/// Environment variable carrying failpoints for the child: `name=action;name=action`.
pub(crate) const CHILD_FAILPOINTS: &str = "BURN_CKPT_RELIABILITY_FAILPOINTS";
/// The files of a checkpoint compared byte for byte.
pub(crate) const FILES: [&str; 4] = [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE];
/// Exit status of a trainer stopped by a signal with its final checkpoint durable.
pub(crate) const EXIT_STOPPED: i32 = train_cli::EXIT_STOPPED as i32;
/// Exit status of a trainer whose grace period ran out.
pub(crate) const EXIT_GRACE_EXPIRED: i32 = train_cli::EXIT_GRACE_EXPIRED as i32;

/// The child side: runs the example trainer when [`CHILD_ARGS`] is set, else returns. Each
/// test file calls it from its `#[test] fn child_entry()`.
pub(crate) fn child_entry() {
    let Ok(args) = std::env::var(CHILD_ARGS) else {
        return;
    };
    if let Ok(fps) = std::env::var(CHILD_FAILPOINTS) {
        for spec in fps.split(';').filter(|s| !s.is_empty()) {
            let (name, action) = spec.split_once('=').expect("failpoint spec name=action");
            fail::cfg(name, action).expect("valid failpoint action");
        }
    }
    let argv = std::iter::once(OsString::from("train")).chain(args.lines().map(OsString::from));
    let code = train_cli::cli(argv);
    std::process::exit(code.into());
}

/// A trainer invocation being built.
#[derive(Debug, Clone)]
pub(crate) struct Trainer {
    args: Vec<String>,
    failpoints: Vec<(String, String)>,
    env: Vec<(String, String)>,
}

/// The example trainer on root `dir` with small, fast settings (a 2-layer MLP of width 32,
/// 100 samples in batches of 8, seed 7, no retention: `--keep-all`, which a later
/// `--keep-last` overrides).
pub(crate) fn trainer(dir: &Path) -> Trainer {
    let mut t = Trainer {
        args: Vec::new(),
        failpoints: Vec::new(),
        env: Vec::new(),
    };
    t = t.arg("--dir", dir.display()).flag("--keep-all");
    for (k, v) in [
        ("--seed", "7"),
        ("--hidden", "32"),
        ("--layers", "2"),
        ("--batch-size", "8"),
        ("--dataset-size", "100"),
    ] {
        t = t.arg(k, v);
    }
    t
}

impl Trainer {
    /// Sets `--flag value` (replacing an earlier value of the same flag).
    pub(crate) fn arg(mut self, flag: &str, value: impl std::fmt::Display) -> Self {
        match self.args.iter().position(|a| a == flag) {
            Some(i) if i + 1 < self.args.len() => self.args[i + 1] = value.to_string(),
            _ => {
                self.args.push(flag.to_string());
                self.args.push(value.to_string());
            }
        }
        self
    }
    /// Adds a bare `--flag`.
    pub(crate) fn flag(mut self, flag: &str) -> Self {
        self.args.push(flag.to_string());
        self
    }
    /// Removes a bare `--flag` given earlier (the fixture's `--keep-all`, say).
    pub(crate) fn without(mut self, flag: &str) -> Self {
        self.args.retain(|a| a != flag);
        self
    }
    /// `--steps N`.
    pub(crate) fn steps(self, n: u64) -> Self {
        self.arg("--steps", n)
    }
    /// `--save-every N`.
    pub(crate) fn save_every(self, n: u64) -> Self {
        self.arg("--save-every", n)
    }
    /// Configures a failpoint (`ckpt_core::failpoints::*`) in the child.
    pub(crate) fn failpoint(mut self, name: &str, action: impl Into<String>) -> Self {
        self.failpoints.push((name.to_string(), action.into()));
        self
    }

    /// Sets an environment variable of the trainer (passed on to every rank under
    /// `mpirun`).
    pub(crate) fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_string(), value.into()));
        self
    }

    /// The command re-executing this test binary as the trainer.
    pub(crate) fn command(&self) -> Command {
        let mut c = Command::new(std::env::current_exe().expect("test binary path"));
        c.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ARGS, self.args.join("\n"))
            .env_remove(CHILD_FAILPOINTS)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        if !self.failpoints.is_empty() {
            let spec: Vec<String> = self
                .failpoints
                .iter()
                .map(|(n, a)| format!("{n}={a}"))
                .collect();
            c.env(CHILD_FAILPOINTS, spec.join(";"));
        }
        c
    }

    /// Runs to completion.
    pub(crate) fn run(&self) -> Finished {
        let t0 = Instant::now();
        let out = self.command().output().expect("spawning the trainer");
        Finished {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: t0.elapsed(),
        }
    }

    /// Runs to completion and asserts success.
    pub(crate) fn run_ok(&self) -> Finished {
        let f = self.run();
        assert!(
            f.status.success(),
            "trainer {:?} failed ({}):\n{}",
            self.args,
            f.status,
            f.stderr
        );
        f
    }

    /// The command running this trainer as `n` MPI ranks under `mpirun` (each rank re-executes
    /// this test binary); `None` when `mpirun` is not installed.
    pub(crate) fn mpirun_command(&self, n: usize) -> Option<Command> {
        let mut c = burn_ckpt::ckpt_zero::collective::mpi_launch::mpirun_command(n, false)?;
        let me = self.command();
        c.args(["-x", CHILD_ARGS, "-x", CHILD_FAILPOINTS]);
        for (k, _) in &self.env {
            c.args(["-x", k]);
        }
        c.arg(me.get_program()).args(me.get_args());
        for (k, v) in me.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env(k, ""),
            };
        }
        c.stdin(Stdio::null());
        Some(c)
    }

    /// Starts the trainer with its stderr streamed line by line.
    pub(crate) fn spawn(&self) -> Running {
        spawn_command(self.command())
    }
}

/// Starts `cmd` with its stderr streamed line by line.
pub(crate) fn spawn_command(mut cmd: Command) -> Running {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the trainer");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Running {
        child,
        lines: rx,
        seen: Vec::new(),
        started: Instant::now(),
    }
}

/// A finished trainer.
#[derive(Debug)]
pub(crate) struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything it wrote on stderr.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl Finished {
    /// The first stderr line starting with `prefix`.
    pub(crate) fn line(&self, prefix: &str) -> Option<&str> {
        self.stderr.lines().find(|l| l.starts_with(prefix))
    }
    /// The last `step N/M` progress line's N.
    pub(crate) fn last_step_line(&self) -> Option<u64> {
        self.stderr.lines().rev().find_map(progress_step)
    }
}

/// The step of a `step N/M ...` progress line.
pub(crate) fn progress_step(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("step ")?;
    rest.split('/').next()?.parse().ok()
}

/// A running trainer whose stderr is watched.
#[derive(Debug)]
pub(crate) struct Running {
    /// The child process.
    pub child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    started: Instant,
}

impl Running {
    /// Process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stderr line matching `pred`; panics after `timeout` or if the trainer
    /// exits first.
    pub(crate) fn wait_for_line(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if pred(&l) {
                        return l;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no matching line within {timeout:?}:\n{}",
                        self.seen.join("\n")
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the trainer ended first:\n{}", self.seen.join("\n"))
                }
            }
        }
    }

    /// Waits for a progress line at step `step` or later.
    pub(crate) fn wait_for_step(&mut self, step: u64, timeout: Duration) -> u64 {
        let l = self.wait_for_line(timeout, |l| progress_step(l).is_some_and(|s| s >= step));
        progress_step(&l).unwrap_or(step)
    }

    /// Sends `signal` (a name for `kill -s`, e.g. `TERM`).
    pub(crate) fn signal(&self, signal: &str) {
        let st = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .expect("running kill");
        assert!(st.success(), "kill -s {signal} failed");
    }

    /// Sends `signal` to every child process of this one (the ranks, under `mpirun`).
    pub(crate) fn signal_children(&self, signal: &str) {
        let out = Command::new("pgrep")
            .args(["-P", &self.pid().to_string()])
            .output()
            .expect("running pgrep");
        let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect();
        assert!(!pids.is_empty(), "no child processes to signal");
        let st = Command::new("kill")
            .arg("-s")
            .arg(signal)
            .args(&pids)
            .status()
            .expect("running kill");
        assert!(st.success(), "kill -s {signal} {pids:?} failed");
    }

    /// Waits for the exit (panics after `timeout`, killing the child) and collects stderr.
    pub(crate) fn wait(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("waiting for the trainer") {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the trainer did not exit within {timeout:?}:\n{}",
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // The reader thread ends at EOF; collect what is left.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        Finished {
            status,
            stderr: self.seen.join("\n"),
            elapsed: self.started.elapsed(),
        }
    }
}

/// Asserts the four checkpoint files of `a` and `b` are byte-identical.
pub(crate) fn assert_same_files(a: &Path, b: &Path) {
    for f in FILES {
        let x = std::fs::read(a.join(f)).unwrap_or_else(|e| panic!("{}: {e}", a.join(f).display()));
        let y = std::fs::read(b.join(f)).unwrap_or_else(|e| panic!("{}: {e}", b.join(f).display()));
        assert!(
            x == y,
            "{f} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// Asserts every file of checkpoint `a` but its manifest (which records times) equals the
/// same file of `b`, and that both hold the same files.
pub(crate) fn assert_same_checkpoint(a: &Path, b: &Path) {
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != ckpt_core::layout::MANIFEST_FILE)
            .collect();
        v.sort();
        v
    };
    let files = names(a);
    assert_eq!(
        files,
        names(b),
        "{} and {} hold different files",
        a.display(),
        b.display()
    );
    for f in files {
        let x = std::fs::read(a.join(&f)).unwrap();
        let y = std::fs::read(b.join(&f)).unwrap();
        assert!(
            x == y,
            "{f} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// Asserts what a reader may rely on at any instant: every published checkpoint fully verifies
/// and `latest` names one of them (or is absent while there are none). Returns the steps.
pub(crate) fn assert_published_valid(root: &Path) -> Vec<u64> {
    let list = ckpt_core::verify_root(root)
        .unwrap_or_else(|e| panic!("{} does not verify: {e}", root.display()));
    let latest = ckpt_core::read_latest(root).expect("readable latest");
    match &latest {
        Some(name) => {
            let step = ckpt_core::layout::parse_step_dir(name).expect("latest names a step");
            ckpt_core::verify_checkpoint(&step_dir(root, step))
                .unwrap_or_else(|e| panic!("latest names an invalid checkpoint: {e}"));
        }
        None => assert!(list.is_empty(), "checkpoints exist but no latest"),
    }
    list.iter().map(|c| c.step).collect()
}

/// What a reader may rely on right after a crash, before any recovery: every published
/// checkpoint fully verifies, and `latest`, if present, names one of them. `latest` may be
/// missing while checkpoints exist only in one window: a crash after the very first
/// checkpoint's rename and before the first `latest` was written (start-up recovery then
/// writes it). Returns the steps and whether that window was hit.
pub(crate) fn assert_crash_consistent(root: &Path) -> (Vec<u64>, bool) {
    let list = ckpt_core::list_checkpoints(root, true)
        .unwrap_or_else(|e| panic!("listing {}: {e}", root.display()));
    for c in &list {
        assert!(
            c.status == ckpt_core::CheckpointStatus::Verified,
            "{} is published but does not verify: {:?}",
            c.path.display(),
            c.status
        );
    }
    let steps: Vec<u64> = list.iter().map(|c| c.step).collect();
    match ckpt_core::read_latest(root).expect("readable latest") {
        Some(name) => {
            let step = ckpt_core::layout::parse_step_dir(&name).expect("latest names a step");
            assert!(
                steps.contains(&step),
                "latest names {name}, not a published checkpoint"
            );
            (steps, false)
        }
        None => {
            // Only the first publication can be caught between its rename and `latest`.
            assert!(steps.len() <= 1, "latest missing with {steps:?} published");
            let window = !steps.is_empty();
            (steps, window)
        }
    }
}

/// The step `latest` names.
pub(crate) fn latest_step(root: &Path) -> Option<u64> {
    ckpt_core::read_latest(root)
        .expect("readable latest")
        .and_then(|n| ckpt_core::layout::parse_step_dir(&n))
}

/// Reads a JSON report.
pub(crate) fn read_report(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("report {}: {e}", path.display()));
    serde_json::from_slice(&bytes).expect("report is JSON")
}

/// Copies a directory tree (files and directories only); a missing `from` gives an empty `to`.
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating the copy");
    if !from.exists() {
        return;
    }
    for e in std::fs::read_dir(from).expect("listing the source") {
        let e = e.expect("listing the source");
        let dst = to.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).expect("copying a file");
        }
    }
}

/// A small, seeded, reproducible random number generator (SplitMix64).
#[derive(Debug, Clone)]
pub(crate) struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
