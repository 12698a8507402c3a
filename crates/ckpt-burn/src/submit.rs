//! A frozen state handed to an engine on the route the memory budget allows: the one save
//! path every single-device loop uses (the example trainer, the learner strategy, a user's
//! own loop), so that staging, the snapshot budget and the per-save model-staging choice are
//! the library's, not each loop's.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Bool, Int, Tensor};
use ckpt_core::{Engine, MemoryGate, Snapshot, Submitted};

use crate::{FrozenState, Result};

/// The device of a module's first parameter.
#[derive(Default)]
struct FirstDevice(Option<burn::tensor::Device>);

impl ModuleVisitor for FirstDevice {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.0.is_none() {
            self.0 = Some(param.val().device());
        }
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        if self.0.is_none() {
            self.0 = Some(param.val().device());
        }
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        if self.0.is_none() {
            self.0 = Some(param.val().device());
        }
    }
}

/// The device of `module`'s first parameter (`None`: a module without parameters).
pub(crate) fn first_device<M: Module>(module: &M) -> Option<burn::tensor::Device> {
    let mut first = FirstDevice::default();
    module.visit(&mut first);
    first.0
}

impl<M: Module + 'static> FrozenState<M> {
    /// The device of the model's first parameter (`None`: a model without parameters).
    pub(crate) fn device(&self) -> Option<burn::tensor::Device> {
        let mut first = FirstDevice::default();
        self.model_visit(&mut first);
        first.0
    }

    /// Whether the state is host memory (Flex): there a background save holds the model's
    /// handles for the writer instead of staging them.
    fn on_host(&self) -> bool {
        self.device()
            .is_some_and(|d| !crate::pinned::holds_device_memory(&d))
    }

    /// Submits this state to `engine` on the route `gate` chooses for what the save needs in
    /// memory (background, throttled or blocking), with the model held for the writer on a
    /// background save of host memory, and the trainer's wait limit. `decorate`
    /// adds to the snapshot (manifest entries, replace) before it is submitted. What the gate
    /// decided comes back in [`Submitted::route`] for [`ckpt_core::CheckpointSession::save`].
    pub fn submit(
        self,
        engine: &mut Engine,
        gate: &mut MemoryGate,
        decorate: impl FnOnce(Snapshot) -> Snapshot,
    ) -> Result<Submitted> {
        let step = self.trainer().step;
        // The optimizer record's size: the last checkpoint's bytes beyond the model (`None`
        // before the first).
        let model_bytes = self.model_bytes();
        let optim_bytes = gate.previous_bytes().map(|b| b.saturating_sub(model_bytes));
        let host = self.on_host();
        let mut need = self.memory(optim_bytes);
        if host {
            // Written through a scratch file: no second copy of the record.
            need.transient = 0;
        }
        let route = gate.route(need, step);
        let frozen = self.with_scratch_dir(engine.root());
        let snapshot = decorate(frozen.into_snapshot_waited(gate.wait_limit(), optim_bytes));
        let outcome = engine.submit(snapshot)?;
        Ok(Submitted { outcome, route })
    }
}
