//! Streaming burnpack encoding. [`write_pack`] writes a burnpack container into any
//! [`Write`], drawing one tensor's bytes at a time and dropping them before the next, so
//! encoding a record needs no buffer of the whole file: peak memory is the largest tensor.
//! Burn's `burn_pack::Writer` streams the same way, but only into a caller-sized buffer or a
//! path, not into the checksumming sink of a checkpoint part. The bytes are exactly those of
//! `burn_pack::Writer` for the same tensors, metadata and scalars (a test compares them).

use std::collections::BTreeMap;
use std::io::Write;

use burn_pack::{Bytes, DType, Header, Scalar, TENSOR_ALIGNMENT, aligned_data_section_start};
use serde::Serialize;

/// Bytes of one tensor taken at a time, as `burn_pack::Writer` does for device-backed bytes.
const CHUNK: usize = 8 << 20;

/// Why a container could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PackError {
    /// A tensor's bytes could not be produced.
    #[error("tensor {name:?}: {reason}")]
    Tensor {
        /// The tensor.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// The metadata could not be encoded or is too large for the format.
    #[error("burnpack metadata: {0}")]
    Metadata(String),
    /// Writing to the sink failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The CBOR metadata block, field for field what burn-pack serializes.
#[derive(Serialize)]
struct Metadata<'a> {
    tensors: BTreeMap<&'a str, Descriptor>,
    #[serde(skip_serializing_if = "is_empty")]
    metadata: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_empty")]
    scalars: &'a BTreeMap<String, Scalar>,
}

#[derive(Serialize)]
struct Descriptor {
    dtype: DType,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
    #[serde(skip_serializing_if = "Option::is_none")]
    param_id: Option<u64>,
}

fn is_empty<K, V>(m: &&BTreeMap<K, V>) -> bool {
    m.is_empty()
}

fn align(offset: u64) -> u64 {
    offset.div_ceil(TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT
}

fn pad(sink: &mut dyn Write, mut n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        sink.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Writes `tensors` (in this order) with `metadata` and `scalars` as one burnpack container
/// into `sink`. Deferred tensors are drawn one at a time, each after the previous one's bytes
/// were written and dropped. Returns the bytes written. A tensor whose bytes differ in length
/// from what its dtype and shape promise is an error naming it.
pub(crate) fn write_pack(
    tensors: Vec<burn_pack::Tensor>,
    metadata: &BTreeMap<String, String>,
    scalars: &BTreeMap<String, Scalar>,
    sink: &mut dyn Write,
) -> Result<u64, PackError> {
    let mut descriptors = BTreeMap::new();
    let mut placements = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in &tensors {
        let len = t.byte_len() as u64;
        let start = align(offset);
        let end = start + len;
        let previous = descriptors.insert(
            t.name.as_str(),
            Descriptor {
                dtype: t.dtype,
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                data_offsets: (start, end),
                param_id: t.param_id,
            },
        );
        if previous.is_some() {
            return Err(PackError::Tensor {
                name: t.name.clone(),
                reason: "appears twice".into(),
            });
        }
        placements.push((start, len));
        offset = end;
    }
    let mut meta = Vec::new();
    ciborium::ser::into_writer(
        &Metadata {
            tensors: descriptors,
            metadata,
            scalars,
        },
        &mut meta,
    )
    .map_err(|e| PackError::Metadata(e.to_string()))?;
    let meta_len = u32::try_from(meta.len())
        .map_err(|_| PackError::Metadata(format!("{} bytes of metadata", meta.len())))?;
    sink.write_all(&Header::new(meta_len).into_bytes())?;
    sink.write_all(&meta)?;
    let data_start = aligned_data_section_start(meta.len()) as u64;
    let mut written = (burn_pack::HEADER_SIZE + meta.len()) as u64;
    pad(sink, data_start - written)?;
    written = data_start;

    let mut pos = 0u64;
    for (t, (start, len)) in tensors.into_iter().zip(placements) {
        pad(sink, start - pos)?;
        let name = t.name.clone();
        let bytes = t.into_bytes().map_err(|e| PackError::Tensor {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        if bytes.len() as u64 != len {
            return Err(PackError::Tensor {
                name,
                reason: format!("{} bytes where its dtype and shape need {len}", bytes.len()),
            });
        }
        write_chunked(&bytes, sink)?;
        drop(bytes);
        pos = start + len;
    }
    written += pos;
    Ok(written)
}

/// Writes `data` in windows of [`CHUNK`] where the backing supports zero-copy windows
/// (device-resident bytes are then read back a window at a time), else in one pass.
fn write_chunked(data: &Bytes, sink: &mut dyn Write) -> std::io::Result<()> {
    let len = data.len();
    let mut offset = 0;
    while offset < len {
        let end = (offset + CHUNK).min(len);
        match data.view(offset, end) {
            Ok(chunk) => {
                sink.write_all(&chunk)?;
                offset = end;
            }
            Err(_) => {
                sink.write_all(&data[offset..])?;
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_pack::{Reader, Writer};

    fn tensors() -> Vec<burn_pack::Tensor> {
        let mk = |name: &str, n: usize, seed: u8, id: Option<u64>| {
            let data: Vec<u8> = (0..n * 4).map(|i| (i as u8).wrapping_mul(seed)).collect();
            burn_pack::Tensor::new(
                name.into(),
                DType::F32,
                vec![n],
                id,
                Bytes::from_bytes_vec(data),
            )
        };
        vec![
            mk("z.weight", 300, 3, Some(7)),
            mk("a.bias", 1, 5, None),
            mk("m.weight", 4096, 11, Some(1 << 40)),
            mk("empty", 0, 1, Some(2)),
        ]
    }

    #[test]
    fn same_bytes_as_burns_writer() {
        let mut meta = BTreeMap::new();
        meta.insert("12".to_string(), "layers.0.weight".to_string());
        let mut scalars = BTreeMap::new();
        scalars.insert("12.__rank".to_string(), Scalar::from(2usize));
        scalars.insert("lr".to_string(), Scalar::Float(0.5));
        for (m, s) in [
            (BTreeMap::new(), BTreeMap::new()),
            (meta.clone(), BTreeMap::new()),
            (meta.clone(), scalars.clone()),
        ] {
            let mut w = Writer::new(tensors());
            for (k, v) in &m {
                w = w.with_metadata(k, v);
            }
            for (k, v) in &s {
                w = w.with_scalar(k, *v);
            }
            let theirs = w.into_bytes().unwrap().to_vec();
            let mut ours = Vec::new();
            let n = write_pack(tensors(), &m, &s, &mut ours).unwrap();
            assert_eq!(n as usize, ours.len());
            assert_eq!(ours, theirs);
            // And Burn reads it back.
            let r = Reader::from_bytes(Bytes::from_bytes_vec(ours)).unwrap();
            assert_eq!(r.tensor_names().len(), 4);
        }
    }

    #[test]
    fn deferred_tensors_are_drawn_one_at_a_time_and_wrong_lengths_are_named() {
        use std::sync::{Arc, Mutex};
        let drawn = Arc::new(Mutex::new(Vec::new()));
        let mk = |name: &'static str, len: usize, give: usize| {
            let drawn = drawn.clone();
            burn_pack::Tensor::deferred(name.into(), DType::U8, vec![len], None, len, move || {
                drawn.lock().unwrap().push(name);
                Ok(Bytes::from_bytes_vec(vec![1; give]))
            })
        };
        let mut out = Vec::new();
        let err = write_pack(
            vec![mk("a", 10, 10), mk("b", 10, 9), mk("c", 10, 10)],
            &BTreeMap::new(),
            &BTreeMap::new(),
            &mut out,
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"b\""), "{err}");
        assert_eq!(*drawn.lock().unwrap(), vec!["a", "b"]);
    }
}
