//! Seeds and parameter ids that make a run reproducible: the backend seed of each step, and
//! `ParamId`s derived from the run's seed so a fresh model matches a resumed one.

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::{Bool, Int, Tensor};

use crate::data::mix_seed;

/// The backend seed for `step`: a pure function of `(base_seed, step)`. Re-seed the device
/// with it before each step (`device.seed(step_seed(seed, step))`) so dropout is the same after
/// a resume.
pub fn step_seed(base_seed: u64, step: u64) -> u64 {
    mix_seed(&[base_seed, step, 0x5eed])
}

pub(crate) struct IdMapper {
    seed: u64,
    path: Vec<String>,
    count: u64,
}

impl IdMapper {
    fn next_id(&mut self) -> ParamId {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.path.join(".").bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.count += 1;
        // Keep ids in the JSON-safe integer range.
        ParamId::from(mix_seed(&[self.seed, h, self.count]) >> 12)
    }
}

impl ModuleMapper for IdMapper {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, mut param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        init_now(&param);
        param.id = self.next_id();
        param
    }
    fn map_int<const D: usize>(
        &mut self,
        mut param: Param<Tensor<D, Int>>,
    ) -> Param<Tensor<D, Int>> {
        init_now(&param);
        param.id = self.next_id();
        param
    }
    fn map_bool<const D: usize>(
        &mut self,
        mut param: Param<Tensor<D, Bool>>,
    ) -> Param<Tensor<D, Bool>> {
        init_now(&param);
        param.id = self.next_id();
        param
    }
}

/// Draws a lazily initialized parameter's value now. Burn 0.22 initializes a parameter at its
/// first use, from the backend RNG as it is then: after the caller seeded it, another thread
/// of the process may have re-seeded it or drawn from it.
/// (Dereferencing an initialized parameter only reads its cached value.)
pub(crate) fn init_now<T: burn::module::ParameterValue>(param: &Param<T>) {
    let _: &T = param;
}

/// Replaces every parameter's random [`ParamId`] with one derived from `(seed, path)`, so two
/// fresh runs with the same seed write byte-identical records (Burn draws ParamIds from an
/// unseedable RNG). Apply right after initializing the model, before any optimizer step.
///
/// Parameters Burn has not initialized yet (it initializes them lazily, at their first use)
/// are initialized here, so their values come from the backend RNG as the caller seeded it,
/// not as it is whenever the model is first used (the RNG is process-global: another thread
/// may re-seed it or draw from it in between).
pub fn assign_param_ids<M: Module>(module: M, seed: u64) -> M {
    module.map(&mut IdMapper {
        seed,
        path: Vec::new(),
        count: 0,
    })
}
