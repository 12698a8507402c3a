//! Scheduling priority of background threads. A persist thread woken by `submit` must not
//! preempt the training thread, and on a machine with few cores its encoding and hashing
//! should yield to training rather than compete with it as an equal.

/// Lowers the calling thread's scheduling priority for background work: Linux `SCHED_BATCH`
/// (a woken thread does not preempt the running one) and a nice value of `nice`. Returns
/// whether it took effect; elsewhere, or when the kernel refuses, the thread keeps its
/// priority (checkpoints are then only slower to become durable, never wrong).
pub fn lower_current_thread(nice: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread with a valid, initialized argument.
        unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            let batch = libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0;
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            let niced = libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0;
            batch && niced
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        false
    }
}

/// Marks the calling thread as a batch thread (Linux `SCHED_BATCH`) at its current nice value:
/// when woken it does not preempt the running thread, and otherwise it competes for the CPU
/// as an equal. For a helper the training thread wakes at every save (the staging thread),
/// whose start should not land inside the save call. Returns whether it took effect; elsewhere
/// the thread keeps its scheduling.
pub fn batch_current_thread() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a plain syscall on the calling thread with a valid, initialized argument.
        unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn lowers_only_the_calling_thread() {
        let before = unsafe { libc::sched_getscheduler(0) };
        let inner = std::thread::spawn(|| {
            let ok = super::lower_current_thread(10);
            (ok, unsafe { libc::sched_getscheduler(0) })
        })
        .join()
        .unwrap();
        assert!(inner.0);
        assert_eq!(inner.1, libc::SCHED_BATCH);
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, before);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_batch_thread_keeps_its_nice_value() {
        let inner = std::thread::spawn(|| {
            // SAFETY: plain syscalls on the calling thread.
            let nice = || unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::getpriority(libc::PRIO_PROCESS, tid)
            };
            let before = nice();
            let ok = super::batch_current_thread();
            (ok, unsafe { libc::sched_getscheduler(0) }, before, nice())
        })
        .join()
        .unwrap();
        assert!(inner.0);
        assert_eq!(inner.1, libc::SCHED_BATCH);
        assert_eq!(inner.2, inner.3);
    }
}
