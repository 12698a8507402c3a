//! Helpers to launch multi-process MPI runs (for tests and tools): find `mpirun` and build a
//! preconfigured command. Compiled with the `testing` feature; it needs neither the `mpi` feature nor an MPI library.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The `mpirun` executable found on `PATH`, if any.
pub fn mpirun_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("mpirun"))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Whether the `mpirun` on `PATH` is Open MPI's (decides which flags it understands).
fn is_open_mpi(mpirun: &PathBuf) -> bool {
    static OPEN_MPI: OnceLock<bool> = OnceLock::new();
    *OPEN_MPI.get_or_init(|| {
        Command::new(mpirun)
            .arg("--version")
            .output()
            .map(|out| {
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                text.contains("Open MPI") || text.contains("OpenRTE")
            })
            .unwrap_or(false)
    })
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// An `mpirun` command for `n` ranks, or `None` if `mpirun` is not on `PATH`.
///
/// With Open MPI it has `-n n --oversubscribe` (more ranks than cores is fine), and when running
/// as root the environment variables that allow it (`OMPI_ALLOW_RUN_AS_ROOT=1`,
/// `OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`). `extra_mca_tcp` adds `--mca btl tcp,self`, forcing the
/// TCP transport that multi-node runs use; it is Open MPI specific, so with another MPI
/// (MPICH's hydra, which oversubscribes by default and gets only `-n n`) it gives `None`.
///
/// The caller appends the program and its arguments (and `-x VAR` to forward variables).
pub fn mpirun_command(n: usize, extra_mca_tcp: bool) -> Option<Command> {
    let mpirun = mpirun_path()?;
    let open_mpi = is_open_mpi(&mpirun);
    if extra_mca_tcp && !open_mpi {
        return None;
    }
    let mut cmd = Command::new(&mpirun);
    cmd.arg("-n").arg(n.to_string());
    if open_mpi {
        cmd.arg("--oversubscribe");
        if extra_mca_tcp {
            cmd.args(["--mca", "btl", "tcp,self"]);
        }
        if running_as_root() {
            cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        }
    }
    Some(cmd)
}
