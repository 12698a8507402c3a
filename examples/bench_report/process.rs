//! Waiting for a benchmark's child process: its exit status, peak RSS, peak memory and CPU
//! time (shared by the report binaries that run the trainer as a child).

use anyhow::{Context, Result};

/// What the kernel says of a child that ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exit {
    /// Its exit status, or 128 + the signal that ended it.
    pub(crate) code: i32,
    /// Its peak resident set, in bytes (the kernel's count).
    pub(crate) peak_rss: u64,
    /// Its peak memory as the machine pays for it, in bytes: resident set plus the growth of
    /// tmpfs (where a save's scratch files go), sampled while it ran
    /// ([`ckpt_demo::perf::MemorySampler`]), and never below [`Self::peak_rss`]. Equal to
    /// `peak_rss` from [`wait4`] alone.
    pub(crate) peak_mem: u64,
    /// CPU seconds it spent in user mode and in the kernel (page faults among them), all
    /// threads.
    pub(crate) cpu_s: f64,
}

/// Waits for process `pid`: its exit status, peak RSS and CPU time.
pub(crate) fn wait4(pid: u32) -> Result<Exit> {
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
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Exit {
        code,
        peak_rss: ru.ru_maxrss as u64 * 1024,
        peak_mem: ru.ru_maxrss as u64 * 1024,
        cpu_s: secs(ru.ru_utime) + secs(ru.ru_stime),
    })
}

/// [`wait4`] while sampling the child's memory ([`Exit::peak_mem`]).
pub(crate) fn wait_sampled(pid: u32) -> Result<Exit> {
    let sampler = ckpt_demo::perf::MemorySampler::start(pid);
    let exit = wait4(pid);
    let sampled = sampler.stop();
    exit.map(|e| Exit {
        peak_mem: e.peak_rss.max(sampled),
        ..e
    })
}
