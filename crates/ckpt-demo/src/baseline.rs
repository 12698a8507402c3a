//! Burn's own checkpointer as the baseline (`--save-mode burn`): `AsyncCheckpointer` over
//! `FileCheckpointer`, records built on the training thread, three independent files per save
//! in `DIR/checkpoint/{model,optim,scheduler}-<step>.bpk`, Burn's own deletes for retention.

use std::path::{Path, PathBuf};
use std::time::Duration;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::store::ModuleRecord;
use burn::train::checkpoint::{AsyncCheckpointer, Checkpointer, FileCheckpointer};
use ckpt_core::SaveEvent;

use crate::model::Mlp;
use crate::{Error, Result};

/// Burn's built-in checkpointers for model, optimizer and scheduler.
pub(crate) struct BurnBaseline {
    model: AsyncCheckpointer<ModuleRecord>,
    optim: AsyncCheckpointer<burn::optim::OptimizerRecord>,
    sched: AsyncCheckpointer<LrSchedulerRecord>,
    dir: PathBuf,
    keep_last: Option<usize>,
    saved: Vec<u64>,
}

impl BurnBaseline {
    /// Checkpointers writing under `root/checkpoint`, keeping the newest `keep_last`.
    pub(crate) fn new(root: &Path, keep_last: Option<usize>) -> Self {
        let dir = Self::dir(root);
        Self {
            model: AsyncCheckpointer::new(FileCheckpointer::new(&dir, "model")),
            optim: AsyncCheckpointer::new(FileCheckpointer::new(&dir, "optim")),
            sched: AsyncCheckpointer::new(FileCheckpointer::new(&dir, "scheduler")),
            dir,
            keep_last,
            saved: Vec::new(),
        }
    }

    /// Where Burn's checkpointer writes for root `root`.
    pub(crate) fn dir(root: &Path) -> PathBuf {
        root.join("checkpoint")
    }

    /// Saves `step` the way Burn's learner does (records built here, files written by Burn's
    /// checkpointer threads). The event's bytes and persist time are unknown until
    /// [`Self::close`].
    pub(crate) fn save(
        &mut self,
        step: u64,
        model: &Mlp,
        optim: &ModuleOptimizer,
        sched: &ModuleLrScheduler,
    ) -> Result<SaveEvent> {
        let e = |e: burn::train::checkpoint::CheckpointerError| {
            Error::Burn(ckpt_burn::Error::Record {
                path: self.dir.clone(),
                reason: e.to_string(),
            })
        };
        let s = step as usize;
        self.model.save(s, model.clone().into_record()).map_err(e)?;
        self.optim.save(s, optim.to_record()).map_err(e)?;
        self.sched.save(s, sched.to_record()).map_err(e)?;
        self.saved.push(step);
        if let Some(k) = self.keep_last
            && self.saved.len() > k.max(1)
        {
            let old = self.saved.remove(0) as usize;
            self.model.delete(old).map_err(e)?;
            self.optim.delete(old).map_err(e)?;
            self.sched.delete(old).map_err(e)?;
        }
        Ok(SaveEvent {
            step,
            path: self.dir.clone(),
            bytes: 0,
            stall: Duration::ZERO,
            blocked: Duration::ZERO,
            persist: Duration::ZERO,
            to_durable: Duration::ZERO,
            sync: true,
            removed: Vec::new(),
        })
    }

    /// Joins Burn's checkpointer threads: every file is written.
    pub(crate) fn close(self) -> Vec<SaveEvent> {
        drop(self);
        Vec::new()
    }

    /// Bytes Burn wrote for `step` in `dir`.
    pub(crate) fn bytes(dir: &Path, step: u64) -> u64 {
        ["model", "optim", "scheduler"]
            .iter()
            .filter_map(|n| std::fs::metadata(dir.join(format!("{n}-{step}.bpk"))).ok())
            .map(|m| m.len())
            .sum()
    }
}
