//! The training state that background snapshots still hold handle clones of, and the wait
//! before an optimizer update that gives it back.
//!
//! A snapshot made with [`crate::FrozenState::into_snapshot`] holds clones of the model's and
//! optimizer's tensor handles until its staging helper has copied them to host memory. An
//! optimizer update that runs meanwhile cannot write those tensors in place: it allocates new
//! ones (copy on write), which on a GPU backend is device memory, the scarcest resource there.
//! Nothing mutates the state between two updates (forward and backward only read it), so the
//! copies can overlap the next step's forward and backward passes and only the update has to
//! wait for them: the DataStates-LLM schedule. [`wait_pinned_at_most`] is that wait, and
//! [`UpdateWait`] says when a training loop takes it.
//!
//! The schedule pays only where the device runs a read beside the compute queued after it.
//! [`OptimizerRead`] says where the optimizer's state is read instead inside the save call,
//! ahead of the next step's work: on a device with one queue, a read issued later waits
//! behind that work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of training state that background saves still hold handle clones of (see
/// [`pinned_state_bytes`]).
static PINNED: AtomicU64 = AtomicU64::new(0);

/// Notified whenever a [`Pin`] is given back, for [`wait_pinned_at_most`].
static RELEASED: Condvar = Condvar::new();
/// The mutex [`RELEASED`] is waited on with (it guards nothing but the wake-up).
static RELEASED_LOCK: Mutex<()> = Mutex::new(());

/// Bytes of training state (model tensors, optimizer state) that snapshots taken with
/// [`crate::FrozenState::into_snapshot`] still hold handle clones of, in this process: not yet
/// copied out by the staging helper or read by the persist thread. An optimizer update that
/// runs while this is above zero copies the tensors it touches instead of writing in place
/// (host memory on Flex, device memory on CubeCL backends). Sample it just before the update
/// that follows a save to see how much of the state that update had to copy.
pub fn pinned_state_bytes() -> u64 {
    PINNED.load(Ordering::Relaxed)
}

/// A share of [`PINNED`], given back when dropped (read out, or the save dropped unread).
pub(crate) struct Pin(u64);

impl Pin {
    pub(crate) fn new(bytes: u64) -> Self {
        PINNED.fetch_add(bytes, Ordering::Relaxed);
        Self(bytes)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        PINNED.fetch_sub(self.0, Ordering::Relaxed);
        // Taking the lock orders this release before a waiter's next check.
        let _guard = RELEASED_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        RELEASED.notify_all();
    }
}

/// Longest wait before an update for the saves to give the state back; past it
/// [`wait_pinned_at_most`] warns and the update copies what is still held.
const UPDATE_WAIT_TIMEOUT: Duration = Duration::from_secs(600);

/// A training loop's waits before its optimizer updates for the saves to give the state back
/// ([`UpdateWait`]), each counted in the stall of the newest save submitted before it: the
/// bookkeeping of a loop of one's own ([`crate::CheckpointManager`]) and of the learner
/// routes.
#[derive(Debug, Default)]
pub struct UpdateWaits {
    newest: Option<u64>,
    waited: std::collections::BTreeMap<u64, Duration>,
}

impl UpdateWaits {
    /// A save of `step` was submitted: the waits that follow count in its stall.
    pub fn saved(&mut self, step: u64) {
        self.newest = Some(step);
    }

    /// The newest save submitted.
    pub fn newest(&self) -> Option<u64> {
        self.newest
    }

    /// Before an optimizer update: where `wait` says so, waits until the saves hold none of
    /// the training state, at most ten minutes (then [`wait_pinned_at_most`] warns and the
    /// update copies what is still held), and counts the time in the newest save's stall.
    /// Returns the time waited (zero without `wait`).
    pub fn before_update(&mut self, wait: bool) -> Duration {
        if !wait {
            return Duration::ZERO;
        }
        let waited = wait_pinned_at_most(0, UPDATE_WAIT_TIMEOUT).waited;
        if let Some(step) = self.newest
            && !waited.is_zero()
        {
            *self.waited.entry(step).or_default() += waited;
        }
        waited
    }

    /// How long updates waited for the save of `step`.
    pub fn of(&self, step: u64) -> Duration {
        self.waited.get(&step).copied().unwrap_or_default()
    }

    /// Adds the updates' waits to the stall of each save of `report` they waited for.
    pub fn add_to(&self, report: &mut ckpt_core::SessionReport) {
        for save in &mut report.saves {
            save.stall_ms += self.of(save.step).as_secs_f64() * 1e3;
        }
    }
}

/// What [`wait_pinned_at_most`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedWait {
    /// How long the calling thread waited.
    pub waited: Duration,
    /// Bytes still held when it stopped waiting ([`pinned_state_bytes`]): at most the limit,
    /// unless the timeout ran out first.
    pub still_pinned: u64,
    /// Whether the timeout ran out with more than the limit still held.
    pub timed_out: bool,
}

/// Blocks until the snapshots of this process hold handle clones of at most `limit` bytes of
/// training state, or `timeout` has passed. Call it just before an optimizer update: the
/// update then writes in place instead of copying what is still held. Sleeps (a condition
/// variable woken as each share is given back), never spins. A timeout emits a warning: the
/// update then copies the rest on write, which costs memory, never correctness.
pub fn wait_pinned_at_most(limit: u64, timeout: Duration) -> PinnedWait {
    let t0 = Instant::now();
    let mut guard = RELEASED_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let pinned = pinned_state_bytes();
        let waited = t0.elapsed();
        if pinned <= limit {
            return PinnedWait {
                waited,
                still_pinned: pinned,
                timed_out: false,
            };
        }
        let Some(left) = timeout.checked_sub(waited).filter(|d| !d.is_zero()) else {
            tracing::warn!(
                pinned_bytes = pinned,
                limit,
                waited_ms = waited.as_secs_f64() * 1e3,
                "a checkpoint still holds training state after the wait before the optimizer \
                 update: the update copies it instead of writing in place (more memory, same \
                 results)"
            );
            return PinnedWait {
                waited,
                still_pinned: pinned,
                timed_out: true,
            };
        };
        // Woken by every release; the short bound only guards against a missed wake-up.
        guard = RELEASED
            .wait_timeout(guard, left.min(Duration::from_millis(50)))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Whether tensors on `device` are device memory: a backend with a device memory pool (the
/// CubeCL ones), not Flex.
pub(crate) fn holds_device_memory(device: &burn::tensor::Device) -> bool {
    device.memory_pool_usage().is_some()
}

/// Whether a training loop waits, before each optimizer update, until its snapshots hold no
/// more handles ([`wait_pinned_at_most`] with a limit of 0).
///
/// Waiting moves the cost of a save from memory to time: the update writes in place (no copy
/// on write, no second copy of the state on the device), and the training thread waits for
/// whatever of the staging has not finished during the step's forward and backward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpdateWait {
    /// Wait where the held state is device memory (a backend with a device memory pool, the
    /// CubeCL backends). On host memory (Flex), wait on the learner route
    /// ([`crate::strategy::CkptTrainingStrategy`]), where a save holds the whole learner until
    /// Burn's records of it are taken and an update meanwhile copies all of it (measured at
    /// 1 GB: extra peak RSS 1.03x the state against 1.33-1.39x, the same lost time with a
    /// core to spare, 0.2-0.4 s more per save with training on both of 2 cores), but not in
    /// a loop of your own ([`crate::CheckpointManager`]), whose saves give the state back
    /// tensor by tensor and where waiting cost more training time than the copies.
    #[default]
    Auto,
    /// Always wait.
    Always,
    /// Never wait: updates copy on write whatever is still held.
    Never,
}

impl UpdateWait {
    /// Whether to wait before updates of parameters on `device` in a loop of your own (decide
    /// once per run: asking a device backend for its memory pool is a call to its server).
    /// The wait itself is [`wait_pinned_at_most`] with a limit of 0.
    pub fn applies_to(self, device: &burn::tensor::Device) -> bool {
        match self {
            UpdateWait::Always => true,
            UpdateWait::Never => false,
            UpdateWait::Auto => holds_device_memory(device),
        }
    }

    /// [`Self::applies_to`] on the learner routes ([`crate::strategy::CkptTrainingStrategy`],
    /// ZeRO's strategy), where a save holds a clone of the whole learner until Burn's records
    /// of it are taken: `Auto` waits on host memory too.
    pub fn applies_to_learner(self, device: &burn::tensor::Device) -> bool {
        self == UpdateWait::Auto || self.applies_to(device)
    }
}

/// When a background save on a device backend reads the optimizer's state to host memory.
///
/// Burn 0.22.1's only view of optimizer state is its record, whose data on CubeCL are lazy
/// device reads, realized one tensor at a time by whichever thread encodes the record. Where
/// the device has one queue (wgpu, Metal, CubeCL's CPU runtime), a read realized on the staging
/// helper after the save call waits behind everything the training thread queued since, the
/// next step's forward and backward passes, and the update then waits for the read: measured
/// through wgpu on lavapipe, 60-210 ms per save against 17-27 ms for the same reads made
/// inside the save call. Where each thread has its own stream (CUDA, HIP), the helper's reads
/// run beside the compute. On host memory (Flex) the record is an eager copy the helper makes,
/// and this setting does not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OptimizerRead {
    /// [`OptimizerRead::AtCapture`] on device runtimes with one queue,
    /// [`OptimizerRead::Background`] on CUDA and HIP.
    #[default]
    Auto,
    /// The save call reads the optimizer's state to host memory before it returns: a stall of
    /// about one read of that state (the reads Burn's own checkpointer makes), after which the
    /// save holds no optimizer handle, so the next update writes in place without waiting.
    AtCapture,
    /// The staging helper reads it after the save call returns, beside the next step's
    /// forward and backward passes; the update waits for what is still held where
    /// [`UpdateWait`] says so.
    Background,
}

impl OptimizerRead {
    /// What it decides on `device`: `None` on host memory (Flex), where it does not apply,
    /// else whether the save call reads the optimizer's state (`true`) or the staging helper
    /// does. Decide once per run: asking a device backend for its memory pool
    /// (`holds_device_memory`) is a call to its server.
    pub fn on(self, device: &burn::tensor::Device) -> Option<bool> {
        holds_device_memory(device).then(|| self.on_device_backend(device))
    }

    /// Whether a save of optimizer state on `device` reads it inside the save call:
    /// `self.on(device) == Some(true)`.
    pub fn at_capture(self, device: &burn::tensor::Device) -> bool {
        self.on(device) == Some(true)
    }

    /// [`Self::on`] for a `device` already known to hold device memory (no server call).
    pub(crate) fn on_device_backend(self, device: &burn::tensor::Device) -> bool {
        match self {
            OptimizerRead::Background => false,
            OptimizerRead::AtCapture => true,
            OptimizerRead::Auto => !runtime_has_thread_streams(&format!("{device:?}")),
        }
    }
}

/// Whether the CubeCL runtime named in a device's debug form gives each thread its own stream
/// (CUDA and HIP: `MultiStream` in their servers), so that a read issued by a helper thread
/// does not queue behind the training thread's work. Burn 0.22.1 exposes the device's runtime
/// only through its dispatch enum, so its debug form (`Cube(Cuda(..))`) is read here.
fn runtime_has_thread_streams(device_debug: &str) -> bool {
    ["Cube(Cuda(", "Cube(Hip("]
        .iter()
        .any(|runtime| device_debug.contains(runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cuda_and_hip_read_the_optimizer_in_the_background_by_default() {
        let wgpu = "Device<Autodiff { device: Cube(Wgpu(WgpuDevice { kind: DefaultDevice, \
                    backend: Auto })), checkpointing: Disabled }>";
        assert!(!runtime_has_thread_streams(wgpu));
        assert!(runtime_has_thread_streams(
            "Device<Autodiff { device: Cube(Cuda(CudaDevice { index: 0 })) }>"
        ));
        assert!(runtime_has_thread_streams(
            "Device<Cube(Hip(HipDevice { index: 1 }))>"
        ));
        assert!(!runtime_has_thread_streams(
            "Device<Cube(Metal(MetalDevice))>"
        ));
        // Host memory: never at the capture, whatever the setting.
        let flex = burn::tensor::Device::flex();
        for read in [
            OptimizerRead::Auto,
            OptimizerRead::AtCapture,
            OptimizerRead::Background,
        ] {
            assert!(!read.at_capture(&flex), "{read:?}");
        }
    }

    // One test touches the process-wide counter, so the cases run in sequence in it.
    #[test]
    fn the_wait_ends_when_the_held_state_is_given_back_or_times_out() {
        let base = pinned_state_bytes();
        let pin = Pin::new(1000);
        // Nothing gives it back: the timeout ends the wait and says so.
        let w = wait_pinned_at_most(base, Duration::from_millis(30));
        assert!(w.timed_out);
        assert!(w.still_pinned >= base + 1000);
        assert!(w.waited >= Duration::from_millis(30));
        // A limit the held bytes fit in returns at once.
        let w = wait_pinned_at_most(base + 1000, Duration::from_secs(5));
        assert!(!w.timed_out);
        // Given back on another thread while the wait is on: it returns, not timed out.
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(pin);
        });
        let w = wait_pinned_at_most(base, Duration::from_secs(30));
        releaser.join().unwrap();
        assert!(!w.timed_out, "{w:?}");
        assert!(w.waited >= Duration::from_millis(90), "{w:?}");
        assert!(w.still_pinned <= base);
    }
}
