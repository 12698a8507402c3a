//! `ckpt-core`: a framework-agnostic, two-phase checkpoint engine.
//!
//! A checkpoint has two phases. The **snapshot** ([`Snapshot`]) is an immutable set of named parts
//! taken at a step boundary; only building it may stall training. The **persist** phase runs on a
//! background thread owned by the [`Engine`]: it writes the parts into a temporary directory,
//! fsyncs them, writes `manifest.json` last (sizes and checksums), renames the directory to
//! `step-<step:08>`, and only then moves the `latest` pointer and applies [`Retention`].
//!
//! Background failures are never only logged: they come back, typed and naming the step, from
//! the next [`Engine::submit`], [`Engine::poll`] or [`Engine::finish`].
//!
//! ```no_run
//! use ckpt_core::{Engine, EngineConfig, Snapshot};
//! # fn main() -> Result<(), ckpt_core::Error> {
//! let (mut engine, recovery) = Engine::open(EngineConfig::new("runs/demo"))?;
//! if let Some(latest) = recovery.latest { println!("resume from step {}", latest.step); }
//! engine.submit(Snapshot::new(10).with_bytes("model.bin", vec![0u8; 1024]))?;
//! engine.finish()?;
//! # Ok(()) }
//! ```

mod checksum;
mod durable;
mod engine;
mod error;
pub mod failpoints;
mod frequency;
mod layout;
mod lock;
mod manifest;
pub mod priority;
mod publish;
mod snapshot;
mod staging;
mod writeback;

pub use durable::{DurableFile, write_durable_file};
pub use engine::{
    Backpressure, Engine, EngineConfig, EngineMetrics, SaveEvent, SubmitOutcome, Summary,
};
pub use error::{Error, Result, Stage};
pub use frequency::{FrequencyController, FrequencyPolicy};
pub use layout::{
    CheckpointInfo, CheckpointStatus, LATEST_FILE, LOCK_FILE, RecoveryReport, Retention,
    checkpoint_dir_name, garbage_collect, list_checkpoints, parse_step_dir, prune, read_latest,
    read_manifest, read_part, recover, verify_checkpoint, verify_root,
};
pub use lock::RootLock;
pub use manifest::{FORMAT_VERSION, FileEntry, MANIFEST_FILE, Manifest};
pub use snapshot::{Part, PartData, PartProducer, Snapshot};
pub use staging::{StagingBuf, StagingError, StagingPool, StagingStats};
