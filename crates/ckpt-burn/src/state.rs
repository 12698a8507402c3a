//! `trainer.bin`: the trainer's own state at a step boundary (global step, epoch, data cursor,
//! seeds), versioned and encoded with bincode 2 through serde.
//!
//! The file starts with a magic tag and the format version, then the payload. A reader refuses
//! versions newer than [`TRAINER_STATE_VERSION`] with [`Error::NewerTrainerState`], naming the
//! file, instead of misreading it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// File name of the trainer state inside a checkpoint directory.
pub const TRAINER_FILE: &str = "trainer.bin";
/// Newest trainer-state format version this build writes and reads.
pub const TRAINER_STATE_VERSION: u32 = 1;
const MAGIC: [u8; 4] = *b"CKTS";

/// Position of a resumable data loader: the next item to yield.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DataCursor {
    /// Epoch (0-based) whose permutation is being read.
    pub epoch: u64,
    /// Items of that epoch already yielded.
    pub position: u64,
    /// Shuffle seed; the order of epoch `e` is a pure function of `(seed, e, shard)`.
    pub shuffle_seed: u64,
}

/// The trainer's state at one optimizer-step boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Format version the state was written with.
    pub version: u32,
    /// Global optimizer steps completed.
    pub step: u64,
    /// Epoch the next batch belongs to.
    pub epoch: u64,
    /// Data-loader cursor.
    pub cursor: DataCursor,
    /// Base seed; the backend RNG is re-seeded from `(base_seed, step)` every step.
    pub base_seed: u64,
}

impl TrainerState {
    /// A state at `step` with the given cursor and base seed.
    pub fn new(step: u64, cursor: DataCursor, base_seed: u64) -> Self {
        Self {
            version: TRAINER_STATE_VERSION,
            step,
            epoch: cursor.epoch,
            cursor,
            base_seed,
        }
    }

    /// Encodes to the `trainer.bin` format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&TRAINER_STATE_VERSION.to_le_bytes());
        let mut state = self.clone();
        state.version = TRAINER_STATE_VERSION;
        // Encoding plain integers into a Vec cannot fail.
        if let Ok(payload) = bincode::serde::encode_to_vec(&state, bincode::config::standard()) {
            out.extend_from_slice(&payload);
        }
        out
    }

    /// Decodes `trainer.bin` bytes; `path` names the file in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::TrainerState {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < 8 || bytes[..4] != MAGIC {
            return Err(bad("not a trainer state file (bad magic)".into()));
        }
        let mut v = [0u8; 4];
        v.copy_from_slice(&bytes[4..8]);
        let found = u32::from_le_bytes(v);
        if found > TRAINER_STATE_VERSION {
            return Err(Error::NewerTrainerState {
                path: path.to_path_buf(),
                found,
                supported: TRAINER_STATE_VERSION,
            });
        }
        if found == 0 {
            return Err(bad("format version 0 is invalid".into()));
        }
        let (state, used): (TrainerState, usize) =
            bincode::serde::decode_from_slice(&bytes[8..], bincode::config::standard())
                .map_err(|e| bad(e.to_string()))?;
        if used != bytes.len() - 8 {
            return Err(bad(format!(
                "{} trailing bytes after the state",
                bytes.len() - 8 - used
            )));
        }
        if state.version != found {
            return Err(bad(format!(
                "header says version {found}, payload says {}",
                state.version
            )));
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_newer_version() {
        let s = TrainerState::new(
            42,
            DataCursor {
                epoch: 3,
                position: 17,
                shuffle_seed: 9,
            },
            7,
        );
        let b = s.to_bytes();
        let p = Path::new("x/trainer.bin");
        assert_eq!(TrainerState::from_bytes(&b, p).unwrap(), s);
        let mut newer = b.clone();
        newer[4..8].copy_from_slice(&(TRAINER_STATE_VERSION + 1).to_le_bytes());
        let e = TrainerState::from_bytes(&newer, p).unwrap_err();
        assert!(matches!(e, Error::NewerTrainerState { .. }));
        assert!(e.to_string().contains("x/trainer.bin"), "{e}");
        let e = TrainerState::from_bytes(&b[..b.len() - 1], p).unwrap_err();
        assert!(matches!(e, Error::TrainerState { .. }), "{e}");
    }
}
