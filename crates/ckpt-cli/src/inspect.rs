//! `ckpt inspect`: what one checkpoint directory holds.
//!
//! Every part is read through [`ckpt_core::read_part`], so sizes and checksums are checked
//! against the manifest before anything is decoded. Burnpack files (`*.bpk`) are listed tensor
//! by tensor (name, dtype, shape, bytes, ParamId and a few leading values), with their scalars
//! and metadata; `trainer.bin` is decoded into step, epoch, data cursor and seeds.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow};
use burn_pack::{Bytes, DType, Reader, Scalar};
use ckpt_burn::{TRAINER_FILE, TrainerState};
use ckpt_core::{Manifest, layout::MANIFEST_FILE};

/// How many leading values of each tensor `--json` shows.
pub(crate) const LEADING_VALUES: usize = 8;

/// One tensor of a burnpack file.
pub(crate) struct TensorEntry {
    /// Name as stored (for a model, the module path, e.g. `layers.0.weight`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// ParamId, when the file records one.
    pub param_id: Option<u64>,
    /// Raw little-endian bytes.
    pub data: Bytes,
}

impl TensorEntry {
    /// The first `n` values as `f64` (empty for dtypes without a plain element layout).
    pub(crate) fn leading(&self, n: usize) -> Vec<f64> {
        leading_values(self.dtype, &self.data, n)
    }
}

/// One decoded burnpack file of a checkpoint.
pub(crate) struct Pack {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// File size in bytes.
    pub bytes: u64,
    /// Tensors in name order.
    pub tensors: Vec<TensorEntry>,
    /// Typed scalars.
    pub scalars: BTreeMap<String, Scalar>,
    /// Key/value metadata.
    pub metadata: BTreeMap<String, String>,
}

/// Everything `inspect` reports about one checkpoint.
pub(crate) struct Inspection {
    /// The checkpoint directory.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its burnpack files, in manifest order.
    pub packs: Vec<Pack>,
    /// Its trainer state, when the checkpoint has a `trainer.bin`.
    pub trainer: Option<TrainerState>,
}

/// Reads the manifest of checkpoint `dir` (self-checksum verified).
pub(crate) fn manifest(dir: &Path) -> Result<Manifest> {
    if !dir.is_dir() {
        anyhow::bail!("{}: not a directory", dir.display());
    }
    let p = dir.join(MANIFEST_FILE);
    let bytes = std::fs::read(&p).with_context(|| format!("{}: cannot read", p.display()))?;
    Ok(Manifest::from_bytes(&bytes, &p)?)
}

/// Reads and decodes the burnpack part `name` of checkpoint `dir` (checksum verified).
pub(crate) fn read_pack(dir: &Path, name: &str, bytes: u64) -> Result<Pack> {
    let data = ckpt_core::read_part(dir, name)?;
    let path = dir.join(name);
    let bad = |e: burn_pack::Error| anyhow!("{}: not a valid burnpack file: {e}", path.display());
    let reader = Reader::from_bytes(Bytes::from_bytes_vec(data)).map_err(bad)?;
    let scalars = reader.scalars().clone();
    let metadata = reader.metadata().clone();
    let tensors = reader
        .into_tensors()
        .map_err(bad)?
        .into_iter()
        .map(|t| {
            let data = t.to_bytes().map_err(bad)?;
            Ok(TensorEntry {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                param_id: t.param_id,
                data,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Pack {
        file: name.to_string(),
        bytes,
        tensors,
        scalars,
        metadata,
    })
}

/// Reads everything `inspect` shows about checkpoint `dir`.
pub(crate) fn inspect(dir: &Path) -> Result<Inspection> {
    let manifest = manifest(dir)?;
    let mut packs = Vec::new();
    let mut trainer = None;
    for f in &manifest.files {
        if f.name.ends_with(".bpk") {
            packs.push(read_pack(dir, &f.name, f.size)?);
        } else if f.name == TRAINER_FILE {
            let bytes = ckpt_core::read_part(dir, &f.name)?;
            trainer = Some(TrainerState::from_bytes(&bytes, &dir.join(&f.name))?);
        }
    }
    Ok(Inspection {
        path: dir.to_path_buf(),
        manifest,
        packs,
        trainer,
    })
}

/// The safetensors-style name of a dtype (`F32`, `BF16`, `BOOL`, ...); quantized types get
/// their debug form.
pub(crate) fn dtype_name(d: DType) -> String {
    match d {
        DType::F64 => "F64".into(),
        DType::F32 | DType::Flex32 => "F32".into(),
        DType::F16 => "F16".into(),
        DType::BF16 => "BF16".into(),
        DType::I64 => "I64".into(),
        DType::I32 => "I32".into(),
        DType::I16 => "I16".into(),
        DType::I8 => "I8".into(),
        DType::U64 => "U64".into(),
        DType::U32 => "U32".into(),
        DType::U16 => "U16".into(),
        DType::U8 => "U8".into(),
        DType::Bool(_) => "BOOL".into(),
        DType::QFloat(s) => format!("QFloat({s:?})"),
    }
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    match exp {
        0 => sign * man * 2f64.powi(-24),
        31 if man == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1.0 + man / 1024.0) * 2f64.powi(exp - 15),
    }
}

/// Decodes the first `n` elements of little-endian `data` of type `dtype` as `f64`.
pub(crate) fn leading_values(dtype: DType, data: &[u8], n: usize) -> Vec<f64> {
    macro_rules! take {
        ($size:expr, $conv:expr) => {
            data.chunks_exact($size)
                .take(n)
                .map(|c| $conv(c.try_into().unwrap_or([0; $size])))
                .collect()
        };
    }
    match dtype {
        DType::F64 => take!(8, f64::from_le_bytes),
        DType::F32 | DType::Flex32 => take!(4, |b| f64::from(f32::from_le_bytes(b))),
        DType::F16 => take!(2, |b| f16_to_f64(u16::from_le_bytes(b))),
        DType::BF16 => take!(2, |b| f64::from(f32::from_bits(
            u32::from(u16::from_le_bytes(b)) << 16
        ))),
        DType::I64 => take!(8, |b| i64::from_le_bytes(b) as f64),
        DType::I32 => take!(4, |b| f64::from(i32::from_le_bytes(b))),
        DType::I16 => take!(2, |b| f64::from(i16::from_le_bytes(b))),
        DType::I8 => take!(1, |b: [u8; 1]| f64::from(b[0] as i8)),
        DType::U64 => take!(8, |b| u64::from_le_bytes(b) as f64),
        DType::U32 => take!(4, |b| f64::from(u32::from_le_bytes(b))),
        DType::U16 => take!(2, |b| f64::from(u16::from_le_bytes(b))),
        DType::U8 => take!(1, |b: [u8; 1]| f64::from(b[0])),
        DType::Bool(_) => data
            .chunks_exact(dtype.size().max(1))
            .take(n)
            .map(|c| if c.iter().any(|&b| b != 0) { 1.0 } else { 0.0 })
            .collect(),
        DType::QFloat(_) => Vec::new(),
    }
}

fn scalar_json(s: &Scalar) -> serde_json::Value {
    match *s {
        Scalar::Int(v) => v.into(),
        Scalar::UInt(v) => v.into(),
        Scalar::Float(v) => v.into(),
        Scalar::Bool(v) => v.into(),
    }
}

fn scalar_text(s: &Scalar) -> String {
    match s {
        Scalar::Int(v) => v.to_string(),
        Scalar::UInt(v) => v.to_string(),
        Scalar::Float(v) => v.to_string(),
        Scalar::Bool(v) => v.to_string(),
    }
}

/// The machine-readable form printed by `ckpt inspect --json`.
pub(crate) fn to_json(i: &Inspection) -> serde_json::Value {
    let m = &i.manifest;
    let packs: Vec<_> = i
        .packs
        .iter()
        .map(|p| {
            let tensors: Vec<_> = p
                .tensors
                .iter()
                .map(|t| {
                    serde_json::json!({
                        "name": t.name,
                        "dtype": dtype_name(t.dtype),
                        "shape": t.shape,
                        "bytes": t.data.len(),
                        "param_id": t.param_id,
                        "leading": t.leading(LEADING_VALUES),
                    })
                })
                .collect();
            let scalars: serde_json::Map<_, _> = p
                .scalars
                .iter()
                .map(|(k, v)| (k.clone(), scalar_json(v)))
                .collect();
            serde_json::json!({
                "file": p.file,
                "bytes": p.bytes,
                "tensors": tensors,
                "scalars": scalars,
                "metadata": p.metadata,
            })
        })
        .collect();
    let trainer = i.trainer.as_ref().map(|t| {
        serde_json::json!({
            "version": t.version,
            "step": t.step,
            "epoch": t.epoch,
            "cursor": {
                "epoch": t.cursor.epoch,
                "position": t.cursor.position,
                "shuffle_seed": t.cursor.shuffle_seed,
            },
            "base_seed": t.base_seed,
        })
    });
    serde_json::json!({
        "path": i.path,
        "step": m.step,
        "epoch": m.epoch,
        "world_size": m.world_size,
        "layout": m.layout,
        "files": packs,
        "trainer": trainer,
    })
}

/// The human-readable form printed by `ckpt inspect`.
pub(crate) fn to_text(i: &Inspection) -> String {
    use std::fmt::Write;
    let m = &i.manifest;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: step {}, epoch {}, world size {}, layout {}",
        i.path.display(),
        m.step,
        m.epoch,
        m.world_size,
        m.layout
    );
    match &i.trainer {
        Some(t) => {
            let _ = writeln!(
                s,
                "trainer: step {}, epoch {}, data cursor epoch {} position {} shuffle seed {}, \
                 base seed {}",
                t.step,
                t.epoch,
                t.cursor.epoch,
                t.cursor.position,
                t.cursor.shuffle_seed,
                t.base_seed
            );
        }
        None => {
            let _ = writeln!(s, "trainer: no {TRAINER_FILE}");
        }
    }
    for p in &i.packs {
        let _ = writeln!(
            s,
            "\n{} ({}, {} tensors, {} scalars)",
            p.file,
            crate::human(p.bytes),
            p.tensors.len(),
            p.scalars.len()
        );
        if !p.tensors.is_empty() {
            let w = p
                .tensors
                .iter()
                .map(|t| t.name.len())
                .max()
                .unwrap_or(4)
                .max(4);
            let _ = writeln!(
                s,
                "  {:<w$}  {:<6} {:<16} {:>12}",
                "NAME", "DTYPE", "SHAPE", "BYTES"
            );
            for t in &p.tensors {
                let _ = writeln!(
                    s,
                    "  {:<w$}  {:<6} {:<16} {:>12}",
                    t.name,
                    dtype_name(t.dtype),
                    format!("{:?}", t.shape),
                    t.data.len()
                );
            }
        }
        for (k, v) in &p.scalars {
            let _ = writeln!(s, "  scalar   {k} = {}", scalar_text(v));
        }
        for (k, v) in &p.metadata {
            let _ = writeln!(s, "  metadata {k} = {v}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_values_decode_every_plain_dtype() {
        let f: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(leading_values(DType::F32, &f, 2), vec![1.5, -2.0]);
        let h: Vec<u8> = [0x3c00u16, 0xc000, 0x7c00]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            leading_values(DType::F16, &h, 8),
            vec![1.0, -2.0, f64::INFINITY]
        );
        let b: Vec<u8> = [0x3fc0u16].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(leading_values(DType::BF16, &b, 8), vec![1.5]);
        assert_eq!(leading_values(DType::I8, &[0xff, 2], 8), vec![-1.0, 2.0]);
        let i: Vec<u8> = (-3i64).to_le_bytes().to_vec();
        assert_eq!(leading_values(DType::I64, &i, 8), vec![-3.0]);
    }
}
