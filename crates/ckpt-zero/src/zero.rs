//! One ZeRO-1 optimizer step for a Burn model, over a [`Collective`] training group.
//!
//! Every rank holds the whole model but only the optimizer state of the parameters its
//! [`Partition`] assigns to it. A step: the gradients of every float parameter are flattened
//! (model order) and all-reduced on the host (Flex has no device collective), divided by the
//! world size; each rank runs its `ModuleOptimizer` on the gradients of the parameters it owns
//! only, so its optimizer creates and updates only that state; then every rank's updated
//! parameters are all-gathered and written into the other ranks' models.
//!
//! With identical inputs on every rank and a power-of-two world size, the mean gradient is
//! bit-for-bit the single-rank gradient (the collective sums in a fixed pairwise tree), and
//! each parameter's update is computed exactly as a single rank computes it: N ranks produce
//! the same bytes as one.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use crate::collective::Collective;
use crate::{Error, Partition, Result};

/// Drives ZeRO-1 steps for one rank.
pub struct Zero1 {
    group: Box<dyn Collective>,
    partition: Partition,
}

impl std::fmt::Debug for Zero1 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zero1")
            .field("rank", &self.group.rank())
            .field("world", &self.group.size())
            .finish()
    }
}

struct FlattenGrads<'a> {
    grads: &'a mut GradientsParams,
    flat: Vec<f32>,
    device: Option<Device>,
    had_grad: std::collections::BTreeSet<u64>,
    error: Option<Error>,
}

impl ModuleVisitor for FlattenGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.error.is_some() {
            return;
        }
        let id = param.id.val();
        match self.grads.remove::<D>(param.id) {
            Some(g) => {
                self.had_grad.insert(id);
                self.device.get_or_insert_with(|| g.device());
                let data = g.into_data();
                match data.as_slice::<f32>() {
                    Ok(v) => self.flat.extend_from_slice(v),
                    Err(e) => {
                        self.error = Some(Error::Tensor {
                            param: id,
                            reason: format!("gradient is not f32: {e:?}"),
                        })
                    }
                }
            }
            // No gradient (frozen parameter): contributes zeros so every rank agrees on the
            // buffer layout; it is not registered back below.
            None => {
                let n = param.lazy_shape().num_elements();
                self.flat.extend(std::iter::repeat_n(0.0, n));
            }
        }
    }
    fn visit_int<const D: usize>(&mut self, _: &Param<Tensor<D, Int>>) {}
    fn visit_bool<const D: usize>(&mut self, _: &Param<Tensor<D, Bool>>) {}
}

struct OwnedGrads<'a> {
    flat: &'a [f32],
    offset: usize,
    rank: usize,
    partition: &'a Partition,
    had_grad: &'a std::collections::BTreeSet<u64>,
    device: &'a Device,
    out: GradientsParams,
}

impl ModuleVisitor for OwnedGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let shape = param.lazy_shape();
        let n = shape.num_elements();
        let id = param.id.val();
        let start = self.offset;
        self.offset += n;
        if self.partition.owns(self.rank, id) && self.had_grad.contains(&id) {
            let data = TensorData::new(self.flat[start..start + n].to_vec(), shape);
            self.out
                .register::<D>(param.id, Tensor::<D>::from_data(data, self.device));
        }
    }
    fn visit_int<const D: usize>(&mut self, _: &Param<Tensor<D, Int>>) {}
    fn visit_bool<const D: usize>(&mut self, _: &Param<Tensor<D, Bool>>) {}
}

/// Collects the raw bytes of the parameters `rank` owns, in model order.
struct PackOwned<'a> {
    rank: usize,
    partition: &'a Partition,
    out: Vec<u8>,
}

impl ModuleVisitor for PackOwned<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.partition.owns(self.rank, param.id.val()) {
            let data = param.val().into_data();
            self.out.extend_from_slice(data.as_bytes());
        }
    }
    fn visit_int<const D: usize>(&mut self, _: &Param<Tensor<D, Int>>) {}
    fn visit_bool<const D: usize>(&mut self, _: &Param<Tensor<D, Bool>>) {}
}

/// Writes the other ranks' parameters (from their all-gathered buffers) into this model.
struct UnpackOthers<'a> {
    rank: usize,
    partition: &'a Partition,
    buffers: &'a [Vec<u8>],
    offsets: Vec<usize>,
    error: Option<Error>,
}

impl ModuleMapper for UnpackOthers<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = param.id.val();
        let Some(owner) = self.partition.owner(id) else {
            return param;
        };
        if owner == self.rank || self.error.is_some() {
            return param;
        }
        let shape = param.lazy_shape();
        let dtype = param.val().dtype();
        let len = shape.num_elements() * dtype.size();
        let start = self.offsets[owner];
        let buf = &self.buffers[owner];
        if start + len > buf.len() {
            self.error = Some(Error::Tensor {
                param: id,
                reason: format!(
                    "rank {owner} sent {} bytes of parameters, expected at least {}",
                    buf.len(),
                    start + len
                ),
            });
            return param;
        }
        self.offsets[owner] += len;
        let data = TensorData::from_bytes_vec(buf[start..start + len].to_vec(), shape, dtype);
        param.map(|t| {
            let require_grad = t.is_require_grad();
            let fresh = Tensor::<D>::from_data(data, &t.device());
            if require_grad {
                fresh.require_grad()
            } else {
                fresh
            }
        })
    }
    fn map_int<const D: usize>(&mut self, p: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        p
    }
    fn map_bool<const D: usize>(&mut self, p: Param<Tensor<D, Bool>>) -> Param<Tensor<D, Bool>> {
        p
    }
}

impl Zero1 {
    /// ZeRO-1 over `group` for `model`'s parameters.
    pub fn new<M: Module>(model: &M, group: Box<dyn Collective>) -> Self {
        let partition = Partition::of(model, group.size());
        Self { group, partition }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.group.size()
    }

    /// The partition in force.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// The training group (for agreeing on things between steps).
    pub fn group(&mut self) -> &mut dyn Collective {
        self.group.as_mut()
    }

    /// One ZeRO-1 step: all-reduce (mean) the gradients, update the owned parameters with
    /// `optim`, then exchange parameters so every rank holds the updated model.
    pub fn step<M: Module>(
        &mut self,
        optim: &mut ModuleOptimizer,
        lr: impl Into<ModuleLearningRate>,
        model: M,
        grads: GradientsParams,
    ) -> Result<M> {
        let owned = self.reduce_owned(&model, grads)?;
        let model = optim.step(lr.into(), model, owned);
        self.exchange(model)
    }

    /// The first half of a step: all-reduces (mean) `grads` over the group and returns the
    /// gradients of the parameters this rank owns (the only ones its optimizer should see).
    pub fn reduce_owned<M: Module>(
        &mut self,
        model: &M,
        mut grads: GradientsParams,
    ) -> Result<GradientsParams> {
        let rank = self.rank();
        let world = self.world();
        let mut flat = FlattenGrads {
            grads: &mut grads,
            flat: Vec::new(),
            device: None,
            had_grad: Default::default(),
            error: None,
        };
        model.visit(&mut flat);
        if let Some(e) = flat.error {
            return Err(e);
        }
        let device = flat.device;
        let had_grad = flat.had_grad;
        let mut flat = flat.flat;
        if world > 1 {
            self.group.all_reduce_sum_f32(&mut flat)?;
            let n = world as f32;
            for v in &mut flat {
                *v /= n;
            }
        }
        let Some(device) = device else {
            // No gradients at all: nothing to update.
            return Ok(GradientsParams::new());
        };
        let mut owned = OwnedGrads {
            flat: &flat,
            offset: 0,
            rank,
            partition: &self.partition,
            had_grad: &had_grad,
            device: &device,
            out: GradientsParams::new(),
        };
        model.visit(&mut owned);
        Ok(owned.out)
    }

    /// The second half of a step: every rank's owned (just updated) parameters are
    /// all-gathered and written into this rank's `model`.
    pub fn exchange<M: Module>(&mut self, model: M) -> Result<M> {
        let rank = self.rank();
        let world = self.world();
        if world == 1 {
            return Ok(model);
        }
        let mut pack = PackOwned {
            rank,
            partition: &self.partition,
            out: Vec::new(),
        };
        model.visit(&mut pack);
        let buffers = self.group.all_gather(&pack.out)?;
        let mut unpack = UnpackOthers {
            rank,
            partition: &self.partition,
            buffers: &buffers,
            offsets: vec![0; world],
            error: None,
        };
        let model = model.map(&mut unpack);
        match unpack.error {
            Some(e) => Err(e),
            None => Ok(model),
        }
    }
}
