//! `ckpt-zero`: ZeRO-1 data-parallel training for Burn with sharded, non-stalling checkpoints.
//!
//! - [`collective`]: the byte-moving [`collective::Collective`] groups (threads always, MPI with
//!   the `mpi` feature); groups are values, every call has a timeout.
//! - [`Partition`] / [`Zero1`]: each rank owns the optimizer state of a deterministic
//!   partition of the parameters; gradients are all-reduced on the training group, owners update
//!   and re-broadcast their parameters.
//! - [`RankManager`]: one rank's checkpointing (the root, the per-step decision agreed by
//!   every rank, the sharded saves, the object-store tier, the report), which every ZeRO loop
//!   goes through.
//! - [`MemoryTier`]: a node-local memory tier (tmpfs) whose parts are replicated to peer ranks
//!   on other nodes; recovery ([`RankManager::resume_from`], [`RankRestore`]) picks the newest
//!   step every rank can restore across the tiers.
//! - [`ShardedSaver`]: every rank snapshots its shard at the same step; a background thread moves
//!   it over a dedicated checkpoint group and rank 0 publishes, consolidated or per rank.
//! - [`shards`]: merge and split optimizer records, so a checkpoint written by N ranks loads on M.
//! - [`strategy`]: ZeRO-1 as a training strategy for Burn's `SupervisedTraining`.
//! - `upload` (feature `remote`): every rank uploads its part of each sharded checkpoint to an
//!   object store; rank 0 publishes it there once every part is up.
//! - [`ranks`]: how ranks agree at a step boundary (save, stop) and how rank threads join.

mod caught;
pub mod checkpoint;
pub mod collective;
mod error;
pub mod manager;
pub mod memory_tier;
pub mod partition;
pub mod ranks;
pub mod restore;
pub mod run_id;
pub mod shards;
pub mod strategy;
#[cfg(feature = "remote")]
pub mod upload;
pub mod zero;

pub use checkpoint::{
    AfterPublish, ModelPart, OptimShard, ShardFormat, ShardJob, ShardOutcome, ShardedSaver,
};
pub use error::{Error, Result};
pub use manager::{RankConfig, RankManager, RankReport, ShardSave, ShardedRoot};
pub use memory_tier::{MemoryTier, MemoryTierReport, SavePhases};
pub use partition::{ParamInfo, Partition, float_params};
pub use ranks::{MemorySaveVerdict, agree_on_boundary, agree_on_memory_save, join_ranks};
pub use restore::{RankRestore, RestoreSource};
pub use zero::Zero1;
