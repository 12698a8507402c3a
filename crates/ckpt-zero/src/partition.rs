//! The ZeRO-1 partition: which rank owns the optimizer state of which parameter.
//!
//! Greedy by size, deterministic: parameters are taken largest first (ties in model order) and
//! each goes to the rank with the fewest owned elements so far (ties to the lowest rank). Every
//! rank computes the same partition from the model's structure and the world size alone.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Bool, Int, Tensor};

/// One float parameter of a model, in model (visiting) order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// The parameter's id (`ParamId::val()`).
    pub id: u64,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl ParamInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

struct Collect(Vec<ParamInfo>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push(ParamInfo {
            id: param.id.val(),
            shape: param.lazy_shape().to_vec(),
        });
    }
    fn visit_int<const D: usize>(&mut self, _param: &Param<Tensor<D, Int>>) {}
    fn visit_bool<const D: usize>(&mut self, _param: &Param<Tensor<D, Bool>>) {}
}

/// The float parameters of `module`, in visiting order.
pub fn float_params<M: Module>(module: &M) -> Vec<ParamInfo> {
    let mut c = Collect(Vec::new());
    module.visit(&mut c);
    c.0
}

/// Ownership of every float parameter by one of `world` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    params: Vec<ParamInfo>,
    owner: BTreeMap<u64, usize>,
    world: usize,
}

impl Partition {
    /// The greedy partition of `params` over `world` ranks (`world` is at least 1).
    pub fn new(params: Vec<ParamInfo>, world: usize) -> Self {
        let world = world.max(1);
        let mut order: Vec<usize> = (0..params.len()).collect();
        order.sort_by(|&a, &b| params[b].numel().cmp(&params[a].numel()).then(a.cmp(&b)));
        let mut load = vec![0usize; world];
        let mut owner = BTreeMap::new();
        for i in order {
            let (rank, _) = load
                .iter()
                .enumerate()
                .min_by_key(|&(r, l)| (*l, r))
                .unwrap_or((0, &0));
            load[rank] += params[i].numel();
            owner.insert(params[i].id, rank);
        }
        Self {
            params,
            owner,
            world,
        }
    }

    /// The partition of `module`'s float parameters.
    pub fn of<M: Module>(module: &M, world: usize) -> Self {
        Self::new(float_params(module), world)
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// All float parameters, in model order.
    pub fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    /// The rank owning parameter `id`, if it is one of the model's.
    pub fn owner(&self, id: u64) -> Option<usize> {
        self.owner.get(&id).copied()
    }

    /// Whether `rank` owns parameter `id`.
    pub fn owns(&self, rank: usize, id: u64) -> bool {
        self.owner(id) == Some(rank)
    }

    /// The parameters `rank` owns, in model order.
    pub fn owned_by(&self, rank: usize) -> impl Iterator<Item = &ParamInfo> {
        self.params.iter().filter(move |p| self.owns(rank, p.id))
    }

    /// Elements owned by each rank.
    pub fn loads(&self) -> Vec<usize> {
        let mut load = vec![0usize; self.world];
        for p in &self.params {
            if let Some(r) = self.owner(p.id) {
                load[r] += p.numel();
            }
        }
        load
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: u64, n: usize) -> ParamInfo {
        ParamInfo { id, shape: vec![n] }
    }

    #[test]
    fn greedy_balances_and_is_deterministic() {
        let params = vec![p(1, 100), p(2, 10), p(3, 100), p(4, 50), p(5, 50)];
        let part = Partition::new(params.clone(), 2);
        assert_eq!(part, Partition::new(params.clone(), 2));
        assert_eq!(part.owner(1), Some(0));
        assert_eq!(part.owner(3), Some(1));
        assert_eq!(part.loads(), vec![160, 150]);
        let one = Partition::new(params, 1);
        assert!(one.params().iter().all(|q| one.owns(0, q.id)));
        // More ranks than parameters: some ranks own nothing.
        let many = Partition::new(vec![p(1, 3)], 4);
        assert_eq!(many.loads(), vec![3, 0, 0, 0]);
    }
}
