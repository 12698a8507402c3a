//! `ckpt export`: a checkpoint's tensors in another format.
//!
//! Safetensors: every tensor of `model.bpk` under its burnpack name (`layers.0.weight`), and,
//! on request, every tensor of the optimizer file(s) under an `optim.` prefix. The file's
//! metadata records the source checkpoint's step and epoch. Burn's `Flex32` is written as
//! `F32` (same bytes) and booleans as one byte each; quantized tensors have no safetensors
//! equivalent and are refused. The output is written to a sibling temporary file and renamed
//! into place, so a failed export never leaves a partial file under the requested name.
//! Exporting the same checkpoint twice gives the same bytes (see [`sort_metadata`]).

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    fs,
    path::Path,
};

use anyhow::{Context, Result, bail};
use burn_pack::DType;
use ckpt_burn::MODEL_FILE;
use safetensors::{Dtype, View};

use crate::inspect::{TensorEntry, manifest, read_pack};

/// Prefix of optimizer tensors in an export.
pub(crate) const OPTIM_PREFIX: &str = "optim.";

/// One tensor ready for safetensors.
struct Out {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Out {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn convert(file: &Path, t: &TensorEntry) -> Result<Out> {
    let dtype = match t.dtype {
        DType::F64 => Dtype::F64,
        DType::F32 | DType::Flex32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::I16 => Dtype::I16,
        DType::I8 => Dtype::I8,
        DType::U64 => Dtype::U64,
        DType::U32 => Dtype::U32,
        DType::U16 => Dtype::U16,
        DType::U8 => Dtype::U8,
        DType::Bool(_) => {
            let width = t.dtype.size().max(1);
            let data = t
                .data
                .chunks_exact(width)
                .map(|c| u8::from(c.iter().any(|&b| b != 0)))
                .collect();
            return Ok(Out {
                dtype: Dtype::BOOL,
                shape: t.shape.clone(),
                data,
            });
        }
        DType::QFloat(_) => bail!(
            "{}: tensor {} is quantized, which safetensors cannot represent",
            file.display(),
            t.name
        ),
    };
    Ok(Out {
        dtype,
        shape: t.shape.clone(),
        data: t.data.to_vec(),
    })
}

/// Writes the tensors of checkpoint `dir` to the safetensors file `out`; with `optim`, also the
/// optimizer's under [`OPTIM_PREFIX`]. Returns the number of tensors written.
pub(crate) fn to_safetensors(dir: &Path, out: &Path, optim: bool) -> Result<usize> {
    let m = manifest(dir)?;
    let mut files: Vec<(&str, &str, u64)> = Vec::new();
    let model = m
        .file(MODEL_FILE)
        .with_context(|| format!("{}: no {MODEL_FILE} in the manifest", dir.display()))?;
    files.push((MODEL_FILE, "", model.size));
    if optim {
        let mut any = false;
        for f in &m.files {
            if f.name.starts_with("optim") && f.name.ends_with(".bpk") {
                files.push((&f.name, OPTIM_PREFIX, f.size));
                any = true;
            }
        }
        if !any {
            bail!("{}: no optimizer file in the manifest", dir.display());
        }
    }
    let mut tensors: BTreeMap<String, Out> = BTreeMap::new();
    for (name, prefix, size) in files {
        let pack = read_pack(dir, name, size)?;
        let path = dir.join(name);
        for t in &pack.tensors {
            let key = format!("{prefix}{}", t.name);
            if tensors.insert(key.clone(), convert(&path, t)?).is_some() {
                bail!("{}: tensor {key} appears twice", path.display());
            }
        }
    }
    let info = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("source".to_string(), "burn-ckpt".to_string()),
        ("step".to_string(), m.step.to_string()),
        ("epoch".to_string(), m.epoch.to_string()),
    ]);
    let unordered: HashMap<String, String> = info.clone().into_iter().collect();
    let mut bytes = safetensors::serialize(tensors.iter(), Some(unordered))
        .with_context(|| format!("{}: cannot encode safetensors", out.display()))?;
    if let Err(why) = sort_metadata(&mut bytes, &info) {
        tracing::warn!(
            file = %out.display(),
            "the export is valid, but its metadata is in this run's order, so exporting the \
             same checkpoint again may give different bytes: {why}"
        );
    }
    write_atomically(out, &bytes)?;
    Ok(tensors.len())
}

/// Rewrites the `__metadata__` object of a safetensors file's header in name order.
///
/// safetensors 0.8 serializes the metadata from a `HashMap`, whose order changes from process
/// to process, so two exports of one checkpoint would differ in their header (the tensors'
/// order is already fixed: by alignment, then name). The crate writes the metadata first, as
/// `{"__metadata__":{...}`; the same entries in name order take the same bytes, so they are
/// written over it in place. Checked, not assumed: the bytes replaced must be exactly `info`.
fn sort_metadata(bytes: &mut [u8], info: &BTreeMap<String, String>) -> Result<()> {
    const OPEN: &[u8] = b"{\"__metadata__\":";
    let sorted = serde_json::to_vec(info)?;
    let at = 8 + OPEN.len();
    let end = at + sorted.len();
    let matches = bytes.get(8..at) == Some(OPEN)
        && bytes
            .get(at..end)
            .and_then(|b| serde_json::from_slice::<BTreeMap<String, String>>(b).ok())
            .is_some_and(|found| &found == info);
    if !matches {
        bail!("the safetensors header does not begin with the metadata written");
    }
    bytes[at..end].copy_from_slice(&sorted);
    Ok(())
}

fn write_atomically(out: &Path, bytes: &[u8]) -> Result<()> {
    let name = out
        .file_name()
        .with_context(|| format!("{}: not a file path", out.display()))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = out.with_file_name(tmp_name);
    let res = fs::write(&tmp, bytes)
        .and_then(|()| fs::File::open(&tmp)?.sync_all())
        .and_then(|()| fs::rename(&tmp, out));
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        bail!("{}: cannot write: {e}", out.display());
    }
    Ok(())
}
