//! [`SaveTuning`]: the three settings that trade a background save's memory against training
//! time, in one value, each `auto` by default. Most runs never set them.
//!
//! | setting | default | what it decides | when to change it |
//! |---|---|---|---|
//! | [`memory_budget`](SaveTuning::memory_budget) | `auto`: half the memory available at start ([`ckpt_core::session::auto_snapshot_budget`]) | extra memory a save may take; a save that would need more is throttled (training waits until it fits), or written while training waits | a machine shared with other jobs (lower), or a save that must never wait (`None`: no limit) |
//! | [`optimizer_read`](SaveTuning::optimizer_read) | `auto`: inside the save call on one-queue device runtimes (wgpu), on the helper on CUDA/HIP | when the optimizer's state is read to host memory on a device backend | benchmarks |
//! | [`update_wait`](SaveTuning::update_wait) | `auto`: on device memory, and on the learner route also on host memory | whether an optimizer update waits until the save no longer holds the state it overwrites | a device short of memory (`Always`) |

use crate::{OptimizerRead, UpdateWait};

/// How background saves trade memory against training time; [`Default`] is `auto` for each
/// (see the module docs for the table of settings).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SaveTuning {
    /// `None`: `auto`; `Some(None)`: no limit; `Some(Some(bytes))`.
    memory_budget: Option<Option<u64>>,
    optimizer_read: OptimizerRead,
    update_wait: UpdateWait,
}

impl SaveTuning {
    /// Extra memory a save may take, in bytes (`None`: no limit). By default `auto`: half the
    /// memory available when the run opens its root.
    pub fn memory_budget(mut self, bytes: Option<u64>) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// When a save on a device backend reads the optimizer's state to host memory
    /// ([`OptimizerRead`]).
    pub fn optimizer_read(mut self, read: OptimizerRead) -> Self {
        self.optimizer_read = read;
        self
    }

    /// Whether optimizer updates wait until the saves hold no more of the state
    /// ([`UpdateWait`]).
    pub fn update_wait(mut self, wait: UpdateWait) -> Self {
        self.update_wait = wait;
        self
    }

    /// The memory budget in bytes (`None`: no limit), `auto` worked out now.
    pub fn budget(&self) -> Option<u64> {
        self.memory_budget
            .unwrap_or_else(ckpt_core::session::auto_snapshot_budget)
    }

    /// The optimizer-read setting.
    pub fn read(&self) -> OptimizerRead {
        self.optimizer_read
    }

    /// The update-wait setting.
    pub fn wait(&self) -> UpdateWait {
        self.update_wait
    }
}
