//! [`RankRestore`]: where one ZeRO-1 rank resumes from, a checkpoint of the disk tier or its
//! part of a memory-tier step, and how it reads its state from there.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use ckpt_burn::{TrainerState, load_model, load_model_bytes, load_scheduler, load_trainer_state};

use crate::shards::{filter_optimizer, read_full_optimizer, shard_file_name};
use crate::{Error, Partition, Result};

/// Which tier a rank restores from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreSource {
    /// A whole checkpoint of the disk tier (consolidated or per rank).
    Disk,
    /// This rank's own part in its node's memory tier.
    OwnMemory,
    /// This rank's part as the replica kept by rank `from` on another node, sent back at
    /// recovery (its own copy was missing or invalid).
    PeerReplica {
        /// The rank that kept the replica.
        from: usize,
    },
    /// A whole checkpoint downloaded from the object store into the disk tier at recovery
    /// (no valid local or memory-tier step was as new).
    ObjectStore {
        /// The checkpoint's URL.
        url: String,
    },
}

/// Where one rank resumes from (from [`crate::RankManager::resume_from`]).
#[derive(Debug)]
pub struct RankRestore {
    step: u64,
    dir: PathBuf,
    world: usize,
    model: Option<Vec<u8>>,
    source: RestoreSource,
}

impl RankRestore {
    /// The disk checkpoint `dir`.
    pub(crate) fn disk(dir: PathBuf) -> Result<Self> {
        let m = ckpt_core::read_manifest(&dir)?;
        Ok(Self {
            step: m.step,
            world: m.world_size as usize,
            dir,
            model: None,
            source: RestoreSource::Disk,
        })
    }

    /// The disk checkpoint, as downloaded from `url`.
    pub(crate) fn downloaded_from(self, url: String) -> Self {
        Self {
            source: RestoreSource::ObjectStore { url },
            ..self
        }
    }

    /// This rank's memory-tier part in `dir`, with rank 0's model `model`.
    pub(crate) fn memory(
        step: u64,
        dir: PathBuf,
        world: usize,
        model: Vec<u8>,
        source: RestoreSource,
    ) -> Self {
        Self {
            step,
            dir,
            world,
            model: Some(model),
            source,
        }
    }

    /// The step resumed from.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The checkpoint directory read: a disk checkpoint, or this rank's memory-tier part.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Which tier it is.
    pub fn source(&self) -> &RestoreSource {
        &self.source
    }

    /// Loads the model's record into `model` (from the disk checkpoint, or the bytes of rank
    /// 0's part every rank received at recovery).
    pub fn load_model<M: Module>(&mut self, model: M) -> Result<M> {
        match self.model.take() {
            Some(bytes) => Ok(load_model_bytes(
                &self.dir.join(ckpt_burn::MODEL_FILE),
                bytes,
                model,
            )?),
            None => Ok(load_model(&self.dir, model)?),
        }
    }

    /// The model's record bytes (for `Learner::load_model` after `ModuleRecord::from_bytes`),
    /// checked against the manifest: from the disk checkpoint, or rank 0's part every rank
    /// received at recovery.
    pub fn model_bytes(&mut self) -> Result<Vec<u8>> {
        match self.model.take() {
            Some(bytes) => Ok(bytes),
            None => Ok(ckpt_core::read_part(&self.dir, ckpt_burn::MODEL_FILE)?),
        }
    }

    /// The scheduler's record bytes, checked against the manifest.
    pub fn scheduler_bytes(&self) -> Result<Vec<u8>> {
        Ok(ckpt_core::read_part(&self.dir, ckpt_burn::SCHEDULER_FILE)?)
    }

    /// This rank's optimizer shard as record bytes for `ModuleOptimizer::from_bytes`: the
    /// parameters `partition` gives `rank`, from the disk checkpoint (any layout, any number
    /// of ranks) or the rank's own memory-tier shard (written by the same partition).
    pub fn optimizer_shard(&self, partition: &Partition, rank: usize) -> Result<Vec<u8>> {
        if self.source == RestoreSource::Disk {
            let full = read_full_optimizer(&self.dir)?;
            return filter_optimizer(&self.dir.display().to_string(), full, |id| {
                partition.owns(rank, id)
            });
        }
        let name = shard_file_name(rank, self.world);
        ckpt_core::read_part(&self.dir, &name).map_err(|e| Error::Shard {
            file: self.dir.join(&name),
            reason: e.to_string(),
        })
    }

    /// Loads the scheduler's record into `scheduler`.
    pub fn load_scheduler(&self, scheduler: ModuleLrScheduler) -> Result<ModuleLrScheduler> {
        Ok(load_scheduler(&self.dir, scheduler)?)
    }

    /// The trainer state (step, epoch, data cursor, seed).
    pub fn trainer_state(&self) -> Result<TrainerState> {
        Ok(load_trainer_state(&self.dir)?)
    }
}
