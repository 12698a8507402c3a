//! `MpiGroup` under a real `mpirun` (feature `mpi`).
//!
//! The parent tests re-execute this test binary under `mpirun -n 4` with `CKPT_ZERO_MPI_CHILD`
//! selecting what the child entry test (`mpi_child`) does on every rank; each rank prints a
//! result line that the parent checks. MPI is never initialized in the parent process. Without
//! `mpirun` on `PATH` the tests print `SKIP: ...` and pass.
#![cfg(feature = "mpi")]

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use ckpt_zero::collective::mpi::{self, MpiGroup};
use ckpt_zero::collective::mpi_launch::{mpirun_command, mpirun_path};
use ckpt_zero::collective::{Collective, conformance};

/// Selects the child scenario; absent in the parent.
const CHILD_ENV: &str = "CKPT_ZERO_MPI_CHILD";
/// Prefix of a rank's success line.
const OK_LINE: &str = "CKPT_ZERO_MPI_OK";
const RANKS: usize = 4;
/// An mpirun still running after this long is killed and the test fails.
const HANG_LIMIT: Duration = Duration::from_secs(180);
/// The fault scenario must end (non-zero) well within this.
const FAULT_LIMIT: Duration = Duration::from_secs(60);

/// One mpirun at a time: they would compete for the 2 cores of the test machine.
static MPIRUN: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------------------------
// Child side (runs on every rank under mpirun)

/// Entry point for the ranks; does nothing in a normal `cargo test` run.
#[test]
fn mpi_child() {
    let Ok(scenario) = std::env::var(CHILD_ENV) else {
        return;
    };
    // A panic below calls MPI_Abort through the hook MpiGroup::world installs.
    let mut world = MpiGroup::world(Duration::from_secs(60)).expect("MPI world group");
    let (rank, size) = (world.rank(), world.size());
    match scenario.as_str() {
        "conformance" => {
            if let Err(e) = conformance::run_all(&mut world, 6) {
                panic!("rank {rank}/{size}: {e}");
            }
            drop(world);
            mpi::finalize().expect("MPI_Finalize");
            println!("\n{OK_LINE} rank={rank} size={size}");
        }
        "exit-mid-gather" => {
            world.set_timeout(Duration::from_secs(120));
            let data = conformance::pattern_bytes(rank as u64, 9 << 20);
            for round in 0..1000 {
                if rank == 2 && round == 2 {
                    eprintln!("rank 2: exiting mid-run without finalizing MPI");
                    std::process::exit(3);
                }
                world.gather(0, &data).expect("gather");
            }
            println!("\n{OK_LINE} rank={rank} size={size} (fault was not injected?)");
        }
        "panic-in-background" => {
            // Only the abort-on-panic hook can end this job quickly: the panicking thread is not
            // the test thread, rank 2's test thread keeps waiting, the others wait in a gather.
            world.set_timeout(Duration::from_secs(600));
            if rank == 2 {
                let _ = thread::spawn(|| panic!("injected panic on a background thread")).join();
                thread::sleep(Duration::from_secs(600));
            }
            // Needs rank 0's reply, which needs rank 2's vote.
            world.barrier().expect("barrier");
            println!("\n{OK_LINE} rank={rank} size={size} (panic did not abort the job?)");
        }
        other => panic!("unknown {CHILD_ENV} scenario {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Parent side

struct Run {
    status: Option<std::process::ExitStatus>,
    output: String,
    took: Duration,
}

/// Runs this test binary under mpirun with `scenario`, killing it after `limit`.
/// `None` (after printing a SKIP line) when mpirun or the requested transport is unavailable.
fn launch(scenario: &str, tcp: bool, limit: Duration) -> Option<Run> {
    if mpirun_path().is_none() {
        println!("SKIP: mpirun not found (install openmpi-bin)");
        return None;
    }
    let Some(mut cmd) = mpirun_command(RANKS, tcp) else {
        println!("SKIP: this mpirun cannot force the TCP transport (not Open MPI)");
        return None;
    };
    let exe = std::env::current_exe().expect("test binary path");
    cmd.args(["-x", CHILD_ENV])
        .arg(exe)
        .args(["mpi_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run_with_limit(cmd, limit)
}

fn run_with_limit(mut cmd: Command, limit: Duration) -> Option<Run> {
    let _one_at_a_time = MPIRUN.lock().unwrap_or_else(|p| p.into_inner());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn mpirun");
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut stream| {
        thread::spawn(move || {
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            text
        })
    })
    .collect();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for mpirun") {
            break Some(status);
        }
        if start.elapsed() > limit {
            stop(&mut child);
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let took = start.elapsed();
    // If mpirun was killed, orphaned ranks could keep the pipes open; don't wait on them forever.
    let output = readers
        .into_iter()
        .map(|r| {
            if status.is_some() {
                r.join().unwrap_or_default()
            } else {
                String::from("(output not collected: mpirun was killed)")
            }
        })
        .collect::<Vec<_>>()
        .join("\n--- stderr ---\n");
    Some(Run {
        status,
        output,
        took,
    })
}

/// Ends a hung mpirun: SIGTERM first (mpirun then terminates its ranks), SIGKILL if needed.
fn stop(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let grace = Instant::now() + Duration::from_secs(10);
    while Instant::now() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn assert_all_ranks_ok(scenario: &str, tcp: bool) {
    let Some(run) = launch(scenario, tcp, HANG_LIMIT) else {
        return;
    };
    assert_ranks_ok(run, RANKS, &format!("mpirun -n {RANKS} (tcp: {tcp})"));
}

fn assert_ranks_ok(run: Run, n: usize, what: &str) {
    let status = run
        .status
        .unwrap_or_else(|| panic!("mpirun hung for {:?}, killed", run.took));
    let mut ranks: Vec<usize> = run
        .output
        .lines()
        .filter_map(|l| l.find(OK_LINE).map(|at| &l[at + OK_LINE.len()..]))
        .filter_map(|rest| rest.trim().strip_prefix("rank="))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    ranks.sort_unstable();
    assert!(
        status.success() && ranks == (0..n).collect::<Vec<_>>(),
        "{what} exited {status} after {:?} with OK lines from ranks {ranks:?}:\n{}",
        run.took,
        run.output
    );
    println!("{what}: all ranks passed in {:?}", run.took);
}

#[test]
fn mpi_singleton_without_mpirun() {
    // A process started without a launcher is a world of one rank (MPI singleton init).
    if mpirun_path().is_none() {
        println!("SKIP: mpirun not found (install openmpi-bin)");
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args(["mpi_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "conformance")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let run = run_with_limit(cmd, HANG_LIMIT).expect("run");
    assert_ranks_ok(run, 1, "singleton");
}

#[test]
fn mpi_conformance_default_transport() {
    assert_all_ranks_ok("conformance", false);
}

#[test]
fn mpi_conformance_tcp_transport() {
    assert_all_ranks_ok("conformance", true);
}

fn assert_job_fails_promptly(scenario: &str) {
    let Some(run) = launch(scenario, false, FAULT_LIMIT) else {
        return;
    };
    let status = run
        .status
        .unwrap_or_else(|| panic!("{scenario}: mpirun hung (killed after {FAULT_LIMIT:?})"));
    assert!(
        !status.success(),
        "{scenario}: mpirun succeeded:\n{}",
        run.output
    );
    assert!(
        !run.output.contains(OK_LINE),
        "{scenario}: a rank finished:\n{}",
        run.output
    );
    println!("{scenario}: job ended with {status} after {:?}", run.took);
}

#[test]
fn mpi_rank_exit_mid_gather_ends_the_job_nonzero() {
    assert_job_fails_promptly("exit-mid-gather");
}

#[test]
fn mpi_panic_on_a_background_thread_aborts_the_job() {
    assert_job_fails_promptly("panic-in-background");
}
