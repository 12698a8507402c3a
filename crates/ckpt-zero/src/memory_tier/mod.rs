//! The node-local memory tier: every rank keeps its part of its newest checkpoints in a
//! directory on the node's memory (tmpfs, for example `/dev/shm`), sends a replica of each to
//! peer ranks on other nodes, and at a restart the ranks recover from the newest step that is
//! whole across the tiers.
//!
//! Layout, under the node-local directory ([`MemoryTier::node_dir`]) of each rank:
//!
//! ```text
//! <node dir>/run-<run id>/rank-<r>-of-<n>/step-<step>/      rank r's own part
//! <node dir>/run-<run id>/replica-<q>-of-<n>/step-<step>/   the replica of rank q's part
//! ```
//!
//! Each `step-*` directory is an ordinary checkpoint directory (manifest, checksums,
//! `latest`, retention; `ckpt ls` and `ckpt verify` read it) whose layout is
//! [`PART_LAYOUT`]: rank r's part holds its optimizer shard (`optim.rank-<r>-of-<n>.bpk`), the
//! scheduler and trainer state, and on rank 0 the model (`model.bpk`). The manifest names the
//! run ([`RUN_KEY`]) and the rank whose part it is ([`RANK_KEY`]); a part of another run is
//! never read, and neither is a directory of another run id.
//!
//! **Durability here means "in the node's memory"**: the tier is published with the same
//! protocol as the disk tier through [`ckpt_core::Storage`] (files written and fsynced, the
//! manifest last, an atomic rename), and on tmpfs fsync returns at once, so a part survives the
//! crash of its process but not the loss of its node. Its replicas on other nodes cover that.
//!
//! A memory save comes every [`MemoryTier::every`] steps, independent of the disk saves, on a
//! thread of its own with a collective group of its own; when any rank's previous memory save
//! is still running, every rank skips this one (counted in the report), so the tier never
//! makes training wait. A save publishes the rank's own part, sends it to its peers
//! ([`crate::collective::Collective::send_recv`]), publishes the replicas it receives, and the
//! ranks agree on the outcome. Recovery ([`crate::RankManager::resume_from`]) picks the newest
//! step that every rank can restore, never one older than the disk tier's newest.

mod recover;
mod saver;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

pub(crate) use recover::recover;
pub(crate) use saver::{TierSaver, remove_rank_dirs};

/// The placeholder in [`MemoryTier::new`]'s directory replaced by the rank's node index (to
/// simulate several nodes on one machine; on real nodes the same path names each node's own
/// memory).
pub const NODE_PLACEHOLDER: &str = "{node}";
/// The manifest layout of a memory-tier part.
pub const PART_LAYOUT: &str = "memory-part";
/// The manifest entry naming the run a part belongs to.
pub const RUN_KEY: &str = "run_id";
/// The manifest entry naming the rank whose part a checkpoint directory holds.
pub const RANK_KEY: &str = "part_of_rank";

/// Failpoint (feature `failpoints`, action `return`): every memory save is waited for before
/// the step returns, so a test knows what the tier holds when it kills the run.
#[cfg(feature = "failpoints")]
pub const FP_MEMORY_TIER_WAIT: &str = "memory_tier_wait";
/// Failpoint (feature `failpoints`, action `return(R@S)`): rank `R`'s own part of the memory
/// save of step `S` fails to publish, as a full tmpfs would make it.
#[cfg(feature = "failpoints")]
pub const FP_MEMORY_TIER_PART: &str = "memory_tier_part";

/// Settings of the node-local memory tier (see the module docs); the same on every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTier {
    dir: PathBuf,
    every: u64,
    replicas: usize,
    ranks_per_node: usize,
    keep: usize,
}

impl MemoryTier {
    /// A tier in the node-local directory `dir` (on tmpfs, for example
    /// `/dev/shm/my-run`; [`NODE_PLACEHOLDER`] in it is replaced by the node index), saving
    /// every `every` steps. Defaults: 1 replica, 1 rank per node, the newest 2 steps kept.
    pub fn new(dir: impl Into<PathBuf>, every: u64) -> Self {
        Self {
            dir: dir.into(),
            every,
            replicas: 1,
            ranks_per_node: 1,
            keep: 2,
        }
    }

    /// How many peers on other nodes keep a replica of each rank's part (default 1; 0 keeps
    /// parts on their own node only).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Ranks per node: ranks `k * n .. (k + 1) * n` share node `k` (default 1).
    pub fn ranks_per_node(mut self, n: usize) -> Self {
        self.ranks_per_node = n;
        self
    }

    /// How many of the newest steps each rank keeps (its own part and each replica; default 2).
    pub fn keep_last(mut self, n: usize) -> Self {
        self.keep = n;
        self
    }

    /// Steps between two memory saves.
    pub fn every(&self) -> u64 {
        self.every
    }

    /// Replicas of each part.
    pub fn replica_count(&self) -> usize {
        self.replicas
    }

    /// Steps kept per part.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Checks the settings for a run of `world` ranks: an error says what to change.
    pub fn validate(&self, world: usize) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("memory tier: {m}")));
        if self.every == 0 {
            return bad("the interval must be at least 1 step".into());
        }
        if self.keep == 0 {
            return bad("it must keep at least 1 step".into());
        }
        if self.ranks_per_node == 0 || !world.is_multiple_of(self.ranks_per_node) {
            return bad(format!(
                "{world} ranks do not split into nodes of {} ranks",
                self.ranks_per_node
            ));
        }
        let nodes = world / self.ranks_per_node;
        if self.replicas >= nodes.max(1) && self.replicas > 0 {
            return bad(format!(
                "{} replica(s) need {} nodes besides each rank's own, but {world} ranks at {} \
                 per node are {nodes} node(s) (give the ranks per node, or fewer replicas)",
                self.replicas, self.replicas, self.ranks_per_node
            ));
        }
        Ok(())
    }

    /// The node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node.max(1)
    }

    /// The node-local directory of `rank` ([`NODE_PLACEHOLDER`] replaced by its node).
    pub fn node_dir(&self, rank: usize) -> PathBuf {
        let s = self.dir.to_string_lossy();
        if s.contains(NODE_PLACEHOLDER) {
            PathBuf::from(s.replace(NODE_PLACEHOLDER, &self.node_of(rank).to_string()))
        } else {
            self.dir.clone()
        }
    }

    /// `rank`'s directory of run `run`.
    pub(crate) fn run_dir(&self, rank: usize, run: &str) -> PathBuf {
        self.node_dir(rank).join(format!("run-{run}"))
    }

    /// Where `rank` keeps its own part.
    pub(crate) fn own_root(&self, rank: usize, world: usize, run: &str) -> PathBuf {
        self.run_dir(rank, run)
            .join(format!("rank-{rank}-of-{world}"))
    }

    /// Where `holder` keeps its replica of rank `of`'s part.
    pub(crate) fn replica_root(
        &self,
        holder: usize,
        of: usize,
        world: usize,
        run: &str,
    ) -> PathBuf {
        self.run_dir(holder, run)
            .join(format!("replica-{of}-of-{world}"))
    }

    /// The rank that keeps replica `k` (1-based) of `rank`'s part: the same place on the
    /// `k`-th next node.
    pub(crate) fn peer(&self, rank: usize, k: usize, world: usize) -> usize {
        (rank + k * self.ranks_per_node) % world
    }

    /// The rank whose replica `k` `rank` keeps.
    pub(crate) fn source(&self, rank: usize, k: usize, world: usize) -> usize {
        (rank + world - (k * self.ranks_per_node) % world) % world
    }

    /// Whether `step` gets a memory save.
    pub(crate) fn due(&self, step: u64) -> bool {
        self.every > 0 && step.is_multiple_of(self.every)
    }
}

/// What the memory tier did on one rank, in [`crate::RankReport::memory`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryTierReport {
    /// The steps of the memory saves published whole on every rank (every part and
    /// replica), in order.
    pub saved: Vec<u64>,
    /// Memory saves every rank skipped because some rank's previous one was still running.
    pub skipped: usize,
    /// Memory saves that were not whole on every rank (each was a warning).
    pub failed: usize,
    /// Each whole save's time on this rank's tier thread, from the part's capture to the
    /// ranks' agreement (ms).
    pub save_ms: Vec<f64>,
    /// The most bytes this rank's tier held after a save (its own parts and its replicas).
    pub peak_bytes: u64,
    /// The tier went off during the run (its group failed; an error said so).
    pub off: bool,
}

/// One rank's part of a step as it travels between ranks (a replica, or a part sent back at
/// recovery).
#[derive(Serialize, Deserialize)]
pub(crate) enum PartMsg {
    /// The part's files.
    Part {
        /// Step.
        step: u64,
        /// Epoch.
        epoch: u64,
        /// File names and contents, as the part's manifest lists them.
        files: Vec<(String, Vec<u8>)>,
    },
    /// The sender has no part to send (its own save failed, or its copy is unreadable).
    Missing(String),
}

impl PartMsg {
    /// Reads the part published in `dir`, every file checked against the manifest.
    pub(crate) fn read(dir: &Path) -> Result<Self> {
        let manifest = ckpt_core::read_manifest(dir)?;
        let mut files = Vec::with_capacity(manifest.files.len());
        for f in &manifest.files {
            let bytes = manifest.read_part_into(dir, &f.name, |n| vec![0u8; n])?;
            files.push((f.name.clone(), bytes));
        }
        Ok(PartMsg::Part {
            step: manifest.step,
            epoch: manifest.epoch,
            files,
        })
    }

    /// The part read from `dir`, or why it is missing.
    pub(crate) fn read_or_missing(dir: &Path) -> Self {
        Self::read(dir).unwrap_or_else(|e| PartMsg::Missing(e.to_string()))
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .map_err(|e| Error::Config(format!("cannot encode a memory-tier part: {e}")))
    }

    pub(crate) fn decode(bytes: &[u8], from: usize) -> Result<Self> {
        bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map(|(v, _)| v)
            .map_err(|e| Error::Tier {
                path: PathBuf::from(format!("rank {from}")),
                reason: format!("undecodable part: {e}"),
            })
    }

    /// Publishes the part in `engine`'s root as rank `of`'s part of run `run` (`world` ranks).
    pub(crate) fn publish(
        self,
        engine: &mut ckpt_core::Engine,
        of: usize,
        world: usize,
        run: &str,
    ) -> Result<u64> {
        let PartMsg::Part { step, epoch, files } = self else {
            return Err(Error::Tier {
                path: engine.root().to_path_buf(),
                reason: format!("no part of rank {of} to publish"),
            });
        };
        let mut snap = part_snapshot(step, epoch, of, world, run);
        for (name, bytes) in files {
            snap = snap.with_bytes(name, bytes);
        }
        engine.submit(snap)?;
        Ok(engine.wait_idle()?.iter().map(|e| e.bytes).sum())
    }
}

/// An empty memory-tier part of rank `of` at `step` (manifest entries set).
pub(crate) fn part_snapshot(
    step: u64,
    epoch: u64,
    of: usize,
    world: usize,
    run: &str,
) -> ckpt_core::Snapshot {
    ckpt_core::Snapshot::new(step)
        .with_epoch(epoch)
        .with_layout(world as u32, PART_LAYOUT)
        .with_meta(RUN_KEY, run)
        .with_meta(RANK_KEY, of as u64)
}

/// Opens a tier root (created if missing) keeping the newest `keep` steps.
pub(crate) fn open_root(root: &Path, keep: usize) -> Result<ckpt_core::Engine> {
    std::fs::create_dir_all(root).map_err(|e| Error::Tier {
        path: root.to_path_buf(),
        reason: format!("cannot create the directory: {e}"),
    })?;
    let config =
        ckpt_core::EngineConfig::new(root).retention(ckpt_core::Retention::keep_last(keep));
    Ok(ckpt_core::Engine::open(config)?.0)
}

/// The steps of rank `of`'s part in `root` that verify (every checksum) and belong to run
/// `run`; each one that does not is a warning naming it.
pub(crate) fn valid_steps(root: &Path, of: usize, run: &str) -> Vec<u64> {
    let list = match ckpt_core::list_checkpoints(root, true) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(tier = %root.display(), error = %e, "memory tier unreadable; not used");
            return Vec::new();
        }
    };
    let mut steps = Vec::new();
    for c in list {
        let Some(m) = c.manifest else {
            let reason = match c.status {
                ckpt_core::CheckpointStatus::Invalid(r) => r,
                _ => "no manifest".into(),
            };
            tracing::warn!(part = %c.path.display(), %reason,
                "memory-tier part of rank {of} is invalid; not used");
            continue;
        };
        let run_ok = m.meta.get(RUN_KEY).and_then(|v| v.as_str()) == Some(run);
        let rank_ok = m.meta.get(RANK_KEY).and_then(|v| v.as_u64()) == Some(of as u64);
        if m.layout != PART_LAYOUT || !run_ok || !rank_ok {
            tracing::warn!(part = %c.path.display(), run = ?m.meta.get(RUN_KEY),
                "memory-tier directory holds a part of another run or rank; ignored");
            continue;
        }
        steps.push(c.step);
    }
    steps
}

/// Total bytes of the checkpoints in `root` (from their manifests).
pub(crate) fn root_bytes(root: &Path) -> u64 {
    ckpt_core::list_checkpoints(root, false)
        .map(|l| l.iter().map(|c| c.bytes).sum())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_sit_on_other_nodes_and_sources_invert_them() {
        let t = MemoryTier::new("/dev/shm/x/node-{node}", 1).ranks_per_node(2);
        t.validate(4).unwrap();
        assert_eq!(t.node_dir(3), PathBuf::from("/dev/shm/x/node-1"));
        assert_eq!(t.node_dir(1), PathBuf::from("/dev/shm/x/node-0"));
        for r in 0..4 {
            let p = t.peer(r, 1, 4);
            assert_ne!(t.node_of(p), t.node_of(r));
            assert_eq!(t.source(p, 1, 4), r);
        }
        let three = MemoryTier::new("/m", 1).replicas(2);
        three.validate(3).unwrap();
        for r in 0..3 {
            for k in 1..=2 {
                assert_eq!(three.source(three.peer(r, k, 3), k, 3), r);
            }
        }
    }

    #[test]
    fn bad_settings_say_what_to_change() {
        let e = |t: MemoryTier, w| t.validate(w).unwrap_err().to_string();
        assert!(e(MemoryTier::new("/m", 0), 2).contains("at least 1 step"));
        assert!(e(MemoryTier::new("/m", 1).ranks_per_node(3), 4).contains("nodes of 3"));
        assert!(e(MemoryTier::new("/m", 1).ranks_per_node(4), 4).contains("1 node"));
        MemoryTier::new("/m", 1)
            .replicas(0)
            .ranks_per_node(4)
            .validate(4)
            .unwrap();
    }
}
