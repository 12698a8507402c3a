//! Recovery across the tiers: the ranks tell each other what their memory tiers hold, agree on
//! the newest step every rank can restore (never older than the disk tier's newest), send
//! missing parts back from their replicas, and each rank restores its part.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{MemoryTier, open_root, publish_frame, read_frame_or_missing, valid_steps};
use crate::collective::Collective;
use crate::restore::{RankRestore, RestoreSource};
use crate::{Error, Result};

/// What one rank's memory tier holds (verified, of this run).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Holdings {
    /// Steps of its own part.
    own: Vec<u64>,
    /// For each rank whose replica it keeps: that rank and the steps.
    replicas: Vec<(u64, Vec<u64>)>,
}

impl Holdings {
    fn has_replica(&self, of: usize, step: u64) -> bool {
        self.replicas
            .iter()
            .any(|(q, steps)| *q == of as u64 && steps.contains(&step))
    }
}

/// The rank whose copy of `step` is missing everywhere, if any.
fn first_lost(all: &[Holdings], step: u64) -> Option<usize> {
    (0..all.len())
        .find(|&q| !all[q].own.contains(&step) && !all.iter().any(|h| h.has_replica(q, step)))
}

fn step_of(dir: &Path) -> Option<u64> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(ckpt_core::layout::parse_step_dir)
}

/// Rank 0's object-store tier at recovery: its newest valid step, and a download of its
/// newest valid checkpoint newer than a step into the disk root (the checkpoint's directory and
/// URL). Asked only after the memory tier: a download happens only when the object store holds
/// the newest step every rank can restore.
pub(crate) struct ObjectStore<'a> {
    /// The newest valid step in the object store.
    pub(crate) newest: Option<u64>,
    /// Downloads the newest valid checkpoint newer than the given step.
    pub(crate) download: Download<'a>,
}

/// Downloads the object store's newest valid checkpoint newer than a step into the disk root:
/// its directory and URL, `None` when there is none.
pub(crate) type Download<'a> =
    Box<dyn FnOnce(Option<u64>) -> Result<Option<(PathBuf, String)>> + 'a>;

/// What rank 0 tells every rank before recovery: the disk tier's newest valid checkpoint and
/// the object store's newest valid step.
#[derive(Serialize, Deserialize)]
struct Persistent {
    disk: Option<String>,
    remote: Option<u64>,
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .map_err(|e| Error::Config(e.to_string()))
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| Error::Tier {
            path: PathBuf::from("rank 0"),
            reason: format!("undecodable {what}: {e}"),
        })
}

/// Recovers this rank (every rank calls it, on the tier's group, before training): `disk` is
/// rank 0's newest valid disk checkpoint and `store` its object-store tier (both ignored on
/// the other ranks). The newest step every rank can restore wins, never older than either
/// persistent tier's newest; an equal step comes from memory, then disk. Returns where this
/// rank restores from, or `None` when there is nothing to resume.
pub(crate) fn recover(
    group: &mut dyn Collective,
    tier: &MemoryTier,
    run: &str,
    disk: Option<PathBuf>,
    store: Option<ObjectStore<'_>>,
) -> Result<Option<RankRestore>> {
    let (rank, world) = (group.rank(), group.size());
    let mut msg = encode(&Persistent {
        disk: disk.map(|p| p.to_string_lossy().into_owned()),
        remote: store.as_ref().and_then(|s| s.newest),
    })?;
    group.broadcast(0, &mut msg)?;
    let told: Persistent = decode(&msg, "persistent tiers")?;
    let disk = told.disk.map(PathBuf::from);
    let disk_step = disk.as_deref().and_then(step_of);
    let remote_step = told.remote.filter(|&r| disk_step.is_none_or(|d| r > d));
    let floor = remote_step.max(disk_step);

    let own_root = tier.own_root(rank, world, run);
    let mine = Holdings {
        own: valid_steps(&own_root, rank, run),
        replicas: (1..=tier.replicas)
            .map(|k| {
                let of = tier.source(rank, k, world);
                let steps = valid_steps(&tier.replica_root(rank, of, world, run), of, run);
                (of as u64, steps)
            })
            .collect(),
    };
    let msg = encode(&mine)?;
    let all: Vec<Holdings> = group
        .all_gather(&msg)?
        .iter()
        .enumerate()
        .map(|(r, b)| {
            bincode::serde::decode_from_slice(b, bincode::config::standard())
                .map(|(h, _)| h)
                .map_err(|e| Error::Tier {
                    path: PathBuf::from(format!("rank {r}")),
                    reason: format!("undecodable holdings: {e}"),
                })
        })
        .collect::<Result<_>>()?;

    let mut steps: Vec<u64> = all
        .iter()
        .flat_map(|h| {
            h.own
                .iter()
                .chain(h.replicas.iter().flat_map(|(_, s)| s.iter()))
                .copied()
        })
        .filter(|&s| floor.is_none_or(|f| s >= f))
        .collect();
    steps.sort_unstable();
    steps.dedup();
    let mut chosen = None;
    for &s in steps.iter().rev() {
        match first_lost(&all, s) {
            None => {
                chosen = Some(s);
                break;
            }
            Some(q) => {
                if rank == 0 {
                    tracing::warn!(
                        step = s,
                        lost_rank = q,
                        "memory-tier step not recoverable: rank {q}'s part has no valid copy \
                         on any rank"
                    );
                }
            }
        }
    }

    let restored = match chosen {
        Some(step) => restore_from_memory(group, tier, run, &all, step)?,
        None => None,
    };
    let restored = match restored {
        Some(r) => Some(r),
        None => match remote_step {
            Some(_) => from_object_store(group, store, disk, disk_step)?,
            None => from_disk(rank, disk)?,
        },
    };
    // Parts newer than the step resumed from belong to an abandoned timeline: the steps the
    // run takes again will be saved afresh.
    let to = restored.as_ref().map(RankRestore::step);
    trim(&own_root, to);
    for k in 1..=tier.replicas {
        let of = tier.source(rank, k, world);
        trim(&tier.replica_root(rank, of, world, run), to);
    }
    Ok(restored)
}

fn from_disk(rank: usize, disk: Option<PathBuf>) -> Result<Option<RankRestore>> {
    if let Some(d) = &disk
        && rank == 0
    {
        tracing::info!(disk = %d.display(), "resuming from the disk tier");
    }
    disk.map(RankRestore::disk).transpose()
}

/// Rank 0 downloads the object store's newest valid checkpoint newer than the disk's into the
/// disk root and tells every rank where it is; the disk's newest when none downloads (each
/// corrupt one a warning), an error on every rank when the download fails.
fn from_object_store(
    group: &mut dyn Collective,
    store: Option<ObjectStore<'_>>,
    disk: Option<PathBuf>,
    disk_step: Option<u64>,
) -> Result<Option<RankRestore>> {
    let rank = group.rank();
    let mut own_error = None;
    let got: std::result::Result<Option<(String, String)>, String> = match store {
        Some(s) if rank == 0 => match (s.download)(disk_step) {
            Ok(d) => Ok(d.map(|(dir, url)| (dir.to_string_lossy().into_owned(), url))),
            Err(e) => {
                let told = Err(e.to_string());
                own_error = Some(e);
                told
            }
        },
        _ => Ok(None),
    };
    let mut msg = encode(&got)?;
    group.broadcast(0, &mut msg)?;
    if let Some(e) = own_error {
        return Err(e);
    }
    let got: std::result::Result<Option<(String, String)>, String> =
        decode(&msg, "object-store restore")?;
    match got {
        Ok(Some((dir, url))) => {
            if rank == 0 {
                tracing::warn!(
                    disk = ?disk_step,
                    "restored the checkpoint from {url}: no valid local checkpoint or \
                     memory-tier step is as new"
                );
            }
            RankRestore::disk(PathBuf::from(dir)).map(|r| Some(r.downloaded_from(url)))
        }
        Ok(None) => from_disk(rank, disk),
        Err(reason) => Err(Error::Tier {
            path: PathBuf::from("rank 0"),
            reason: format!("restoring from the object store failed: {reason}"),
        }),
    }
}

/// Sends every rank without its own part of `step` the replica a peer keeps, then agrees; rank
/// 0's model goes to every rank. `None` (after a warning) when some rank could not restore.
fn restore_from_memory(
    group: &mut dyn Collective,
    tier: &MemoryTier,
    run: &str,
    all: &[Holdings],
    step: u64,
) -> Result<Option<RankRestore>> {
    let (rank, world) = (group.rank(), group.size());
    let own_root = tier.own_root(rank, world, run);
    let own_dir = own_root.join(ckpt_core::layout::checkpoint_dir_name(step));
    let mut source = RestoreSource::OwnMemory;
    let mut failure: Option<String> = None;
    for q in 0..world {
        if all[q].own.contains(&step) {
            continue;
        }
        let Some(h) = (0..world).find(|&h| all[h].has_replica(q, step)) else {
            continue; // not reached: `step` is whole
        };
        let data = if rank == h {
            let dir = tier
                .replica_root(h, q, world, run)
                .join(ckpt_core::layout::checkpoint_dir_name(step));
            read_frame_or_missing(&dir)?
        } else {
            Vec::new()
        };
        let got = group.send_recv((rank == h).then_some(q), &data, (rank == q).then_some(h))?;
        if let Some(bytes) = got {
            source = RestoreSource::PeerReplica { from: h };
            // Whatever this rank has of `step` or later is not a valid part of this run.
            trim(&own_root, step.checked_sub(1));
            let r = open_root(&own_root, tier.keep).and_then(|mut engine| {
                let r = publish_frame(bytes, h, &mut engine, rank, world, run);
                engine.finish()?;
                r
            });
            match r {
                Ok(_) => tracing::warn!(
                    step,
                    from_rank = h,
                    "this rank's memory-tier part was missing: restored from rank {h}'s replica"
                ),
                Err(e) => failure = Some(format!("rank {rank}: replica from rank {h}: {e}")),
            }
        }
    }
    let mut model = Vec::new();
    if rank == 0 {
        match ckpt_core::read_part(&own_dir, ckpt_burn::MODEL_FILE) {
            Ok(b) => model = b,
            Err(e) => {
                failure.get_or_insert(format!("rank 0: {e}"));
            }
        }
    }
    if !group.all_agree(failure.is_none())? {
        tracing::warn!(
            step,
            reason = failure.as_deref().unwrap_or("another rank failed"),
            "memory-tier recovery failed; falling back to the disk tier"
        );
        return Ok(None);
    }
    group.broadcast(0, &mut model)?;
    if rank == 0 {
        tracing::info!(step, "resuming from the memory tier");
    }
    Ok(Some(RankRestore::memory(
        step, own_dir, world, model, source,
    )))
}

/// Removes the checkpoints of `root` newer than `to` (all of them for `None`).
fn trim(root: &Path, to: Option<u64>) {
    if !root.exists() {
        return;
    }
    let r = ckpt_core::Engine::open(ckpt_core::EngineConfig::new(root)).and_then(|(mut e, _)| {
        let moved = e.rewind(to)?;
        e.finish()?;
        Ok(moved)
    });
    match r {
        Ok(moved) => {
            for (_, aside) in moved {
                let _ = std::fs::remove_dir_all(aside);
            }
        }
        Err(e) => tracing::warn!(tier = %root.display(), error = %e,
            "cannot remove memory-tier parts of the abandoned timeline"),
    }
}
