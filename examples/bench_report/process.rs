//! Waiting for a benchmark's child process: its exit status and peak RSS (shared by the
//! report binaries that run the trainer as a child).

use anyhow::{Context, Result};

/// Waits for process `pid`; its exit status (or 128 + signal) and peak RSS in bytes.
pub(crate) fn wait4(pid: u32) -> Result<(i32, u64)> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `status` and `ru` are valid for writes; `pid` is our own child, not yet reaped.
    let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("wait4");
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Ok((code, ru.ru_maxrss as u64 * 1024))
}
