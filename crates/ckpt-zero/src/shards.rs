//! Optimizer-state shards: split a Burn optimizer record by parameter, merge shards back.
//!
//! Burn's `OptimizerRecord` (burnpack) keys everything by parameter id: tensors are named
//! `"{param_id}.{field}"`, scalars `"{param_id}.{field}"`, and the path metadata `"{param_id}"`.
//! A ZeRO-1 rank's optimizer only holds the state of the parameters it owns, so its record *is*
//! its shard; merging the shards of all ranks gives the record a single rank would have, and
//! re-encoding it in the canonical (name-sorted) layout gives the same bytes. Filtering a full
//! record by a new partition is how a checkpoint written by N ranks is loaded on M.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::tensor::Bytes;
use burn_pack::{Reader, Writer};
use ckpt_burn::{OPTIM_FILE, canonicalize_optimizer_bytes};

use crate::{Error, Result};

/// The file name of rank `rank`'s shard in a per-rank checkpoint.
pub fn shard_file_name(rank: usize, world: usize) -> String {
    format!("optim.rank-{rank}-of-{world}.bpk")
}

/// Parses a shard file name back into `(rank, world)`.
pub fn parse_shard_file_name(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("optim.rank-")?.strip_suffix(".bpk")?;
    let (r, n) = rest.split_once("-of-")?;
    let (r, n) = (r.parse().ok()?, n.parse().ok()?);
    (r < n).then_some((r, n))
}

/// The parameter id a record key belongs to (`"123.moment_1"` and `"123"` give 123).
fn key_param_id(key: &str) -> Option<u64> {
    key.split('.').next()?.parse().ok()
}

fn bad(source: &str, reason: impl std::fmt::Display) -> Error {
    Error::Shard {
        file: PathBuf::from(source),
        reason: reason.to_string(),
    }
}

/// Merges optimizer-record shards (name, bytes) into one record in the canonical layout. Two
/// shards holding state for the same parameter are an error naming both.
pub fn merge_optimizer_shards(shards: Vec<(String, Vec<u8>)>) -> Result<Vec<u8>> {
    let mut tensors = Vec::new();
    let mut scalars = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    let mut seen: BTreeMap<u64, String> = BTreeMap::new();
    for (name, bytes) in shards {
        let reader = Reader::from_bytes(Bytes::from_bytes_vec(bytes)).map_err(|e| bad(&name, e))?;
        let mut ids = BTreeSet::new();
        for (k, v) in reader.scalars() {
            ids.extend(key_param_id(k));
            scalars.insert(k.clone(), *v);
        }
        for (k, v) in reader.metadata() {
            ids.extend(key_param_id(k));
            metadata.insert(k.clone(), v.clone());
        }
        let ts = reader.into_tensors().map_err(|e| bad(&name, e))?;
        for t in &ts {
            ids.extend(t.param_id);
        }
        for id in ids {
            if let Some(other) = seen.insert(id, name.clone()) {
                return Err(bad(
                    &name,
                    format!("holds state of parameter {id}, which {other} holds too"),
                ));
            }
        }
        tensors.extend(ts);
    }
    write_canonical("merged shards", tensors, scalars, metadata)
}

/// Writes an optimizer record from its parts in the canonical layout `ckpt-burn` writes.
fn write_canonical(
    source: &str,
    tensors: Vec<burn_pack::Tensor>,
    scalars: impl IntoIterator<Item = (String, burn_pack::Scalar)>,
    metadata: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<u8>> {
    let mut writer = Writer::new(tensors);
    for (k, v) in scalars {
        writer = writer.with_scalar(&k, v);
    }
    for (k, v) in metadata {
        writer = writer.with_metadata(&k, &v);
    }
    let bytes = writer.into_bytes().map_err(|e| bad(source, e))?;
    canonicalize_optimizer_bytes(bytes.to_vec()).map_err(Error::Burn)
}

/// Keeps only the state of parameters for which `keep(id)` holds (keys that belong to no
/// parameter are kept), in the canonical layout.
pub fn filter_optimizer(
    source: &str,
    bytes: Vec<u8>,
    keep: impl Fn(u64) -> bool,
) -> Result<Vec<u8>> {
    let reader = Reader::from_bytes(Bytes::from_bytes_vec(bytes)).map_err(|e| bad(source, e))?;
    let keep_key = |k: &str| key_param_id(k).is_none_or(&keep);
    let scalars: Vec<_> = reader
        .scalars()
        .iter()
        .filter(|(k, _)| keep_key(k))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let metadata: Vec<_> = reader
        .metadata()
        .iter()
        .filter(|(k, _)| keep_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let tensors: Vec<_> = reader
        .into_tensors()
        .map_err(|e| bad(source, e))?
        .into_iter()
        .filter(|t| t.param_id.is_none_or(&keep))
        .collect();
    write_canonical(source, tensors, scalars, metadata)
}

/// The full optimizer record of a checkpoint directory in the canonical layout, whatever layout
/// it was written in: the consolidated `optim.bpk`, or every `optim.rank-<r>-of-<n>.bpk` its
/// manifest lists, merged. A missing or inconsistent shard set is an error naming the file.
pub fn read_full_optimizer(dir: &Path) -> Result<Vec<u8>> {
    let manifest = ckpt_core::read_manifest(dir).map_err(Error::Core)?;
    let read =
        |name: &str| -> Result<Vec<u8>> { ckpt_core::read_part(dir, name).map_err(Error::Core) };
    if manifest.files.iter().any(|f| f.name == OPTIM_FILE) {
        return read(OPTIM_FILE);
    }
    let mut shards: Vec<(usize, usize, String)> = manifest
        .files
        .iter()
        .filter_map(|f| parse_shard_file_name(&f.name).map(|(r, n)| (r, n, f.name.clone())))
        .collect();
    shards.sort();
    let world = shards.first().map(|s| s.1).ok_or_else(|| {
        bad(
            &dir.join(OPTIM_FILE).display().to_string(),
            "the checkpoint has neither optim.bpk nor optimizer shards",
        )
    })?;
    let ranks: Vec<usize> = shards.iter().map(|s| s.0).collect();
    if shards.iter().any(|s| s.1 != world) || ranks != (0..world).collect::<Vec<_>>() {
        return Err(bad(
            &dir.display().to_string(),
            format!("incomplete shard set: ranks {ranks:?} of {world}"),
        ));
    }
    let mut parts = Vec::with_capacity(world);
    for (_, _, name) in shards {
        let bytes = read(&name)?;
        parts.push((dir.join(&name).display().to_string(), bytes));
    }
    merge_optimizer_shards(parts)
}
