//! `manifest.json`: the single source of truth for a checkpoint directory.
//!
//! Human-readable JSON listing every file with its size and XXH3-64 checksum. The manifest
//! protects itself too: its last field, `manifest_xxh3`, is the checksum of every byte before
//! that field's value, and the file must end exactly after it, so flipping any single byte of
//! the manifest is detected.

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    Error, Result, checksum,
    naming::{PartNameError, check_part_names},
};

/// File name of the manifest inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Manifest format version written by this crate; newer versions are refused.
pub const FORMAT_VERSION: u32 = 1;

const SELF_KEY: &str = "\"manifest_xxh3\": \"";
const TRAILER: &str = "\"\n}\n";

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the checkpoint directory.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// XXH3-64 of the contents, 16 lowercase hex digits.
    pub xxh3: String,
}

/// The contents of `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// Global step.
    pub step: u64,
    /// Epoch at that step.
    pub epoch: u64,
    /// Number of ranks that wrote this checkpoint.
    pub world_size: u32,
    /// Layout (`single`, `consolidated`, `per-rank`).
    pub layout: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Every file with size and checksum.
    pub files: Vec<FileEntry>,
    /// Extra entries supplied by the snapshot.
    #[serde(default)]
    pub meta: BTreeMap<String, serde_json::Value>,
}

impl Manifest {
    /// Manifest entry naming what a checkpoint's number counts where it is not optimizer
    /// steps: `"epoch"` for a checkpoint Burn's epoch loop keyed by its epoch number.
    pub const CHECKPOINT_KEY: &'static str = "checkpoint_key";

    /// Whether the checkpoint's number is an epoch, not a step ([`Self::CHECKPOINT_KEY`]).
    pub fn keyed_by_epoch(&self) -> bool {
        self.meta
            .get(Self::CHECKPOINT_KEY)
            .is_some_and(|v| v == "epoch")
    }

    /// Total bytes of the listed files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// The entry for `name`.
    pub fn file(&self, name: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Serializes with the self-checksum appended.
    pub fn to_bytes(&self) -> Vec<u8> {
        // `to_string_pretty` of a struct cannot fail (all keys are strings).
        let body = serde_json::to_string_pretty(self).unwrap_or_default();
        let body = body
            .trim_end()
            .strip_suffix('}')
            .unwrap_or(&body)
            .trim_end();
        let mut out = String::with_capacity(body.len() + 64);
        out.push_str(body);
        out.push_str(",\n  ");
        out.push_str(SELF_KEY);
        let digest = checksum::of(out.as_bytes());
        out.push_str(&checksum::hex(digest));
        out.push_str(TRAILER);
        out.into_bytes()
    }

    /// Parses and checks the self-checksum; `path` is used in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| Error::corrupt(path, "manifest is not valid UTF-8"))?;
        let at = text
            .rfind(SELF_KEY)
            .ok_or_else(|| Error::corrupt(path, "manifest has no self-checksum (truncated?)"))?;
        let covered = at + SELF_KEY.len();
        let rest = &text[covered..];
        if rest.len() != 16 + TRAILER.len() || !rest.ends_with(TRAILER) {
            return Err(Error::corrupt(
                path,
                "manifest does not end with its self-checksum",
            ));
        }
        let expect = checksum::hex(checksum::of(&bytes[..covered]));
        if rest[..16] != expect {
            return Err(Error::corrupt(
                path,
                format!(
                    "manifest checksum mismatch (stored {}, computed {expect})",
                    &rest[..16]
                ),
            ));
        }
        #[derive(Deserialize)]
        struct Versioned {
            format_version: u32,
        }
        let v: Versioned = serde_json::from_slice(bytes)
            .map_err(|e| Error::corrupt(path, format!("manifest is not valid JSON: {e}")))?;
        if v.format_version > FORMAT_VERSION {
            return Err(Error::corrupt(
                path,
                format!(
                    "manifest format version {} is newer than this build supports ({FORMAT_VERSION}); upgrade burn-ckpt",
                    v.format_version
                ),
            ));
        }
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Error::corrupt(path, format!("manifest is malformed: {e}")))?;
        // Every listed file must be a plain name inside the checkpoint directory, listed once:
        // a (hostile or corrupt) entry like `../x` must not make readers touch other files.
        check_part_names(m.files.iter().map(|f| f.name.as_str())).map_err(|e| match e {
            PartNameError::NotPlain(n) => Error::corrupt(
                path,
                format!("manifest lists {n:?}, which is not a plain file name in the checkpoint"),
            ),
            PartNameError::Duplicate(n) => {
                Error::corrupt(path, format!("manifest lists {n:?} twice"))
            }
        })?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            step: 7,
            epoch: 1,
            world_size: 1,
            layout: "single".into(),
            created_unix_ms: 1,
            files: vec![FileEntry {
                name: "a".into(),
                size: 3,
                xxh3: "0011223344556677".into(),
            }],
            meta: BTreeMap::new(),
        }
    }

    #[test]
    fn roundtrip_and_every_byte_flip_is_caught() {
        let m = sample();
        let bytes = m.to_bytes();
        let p = Path::new("manifest.json");
        assert_eq!(Manifest::from_bytes(&bytes, p).unwrap(), m);
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                assert!(
                    Manifest::from_bytes(&b, p).is_err(),
                    "flip {flip:#x} at byte {i} not caught"
                );
            }
        }
    }
}
