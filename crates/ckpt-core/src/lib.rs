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
mod direct;
mod durable;
pub mod engine;
mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
#[cfg(not(feature = "failpoints"))]
#[allow(dead_code, unreachable_pub)]
mod failpoints;
mod frequency;
mod gate;
mod held;
mod latest;
pub mod layout;
mod listing;
mod lock;
mod manifest;
mod naming;
// For the sibling crates' background threads (ckpt-zero's shard writers); not an API.
#[doc(hidden)]
pub mod priority;
// Closures give the failpoints (compiled in with `failpoints`) an `io::Result` to return from.
#[cfg_attr(not(feature = "failpoints"), allow(clippy::redundant_closure_call))]
mod publish;
mod recovery;
mod report;
// Closures give the failpoints (compiled in with `failpoints`) an `io::Result` to return from.
#[cfg_attr(not(feature = "failpoints"), allow(clippy::redundant_closure_call))]
mod retention;
mod rewind;
pub mod session;
pub mod snapshot;
pub mod storage;
mod target;
mod verify;
mod writeback;

pub use durable::{DurableFile, write_durable_file};
pub use engine::{Backpressure, Engine, EngineConfig, SaveEvent};
pub use error::{Error, Result, Stage};
pub use frequency::FrequencyPolicy;
pub use latest::read_latest;
pub use listing::{CheckpointInfo, CheckpointStatus, list_checkpoints, verify_root};
pub use lock::RootLock;
pub use manifest::Manifest;
pub use recovery::{RecoveryReport, garbage_collect, recover};
pub use retention::{Retention, prune};
pub use session::{
    CheckpointSession, MemoryGate, SaveErrorPolicy, SaveRoute, SaveTarget, SessionConfig,
    SessionReport, Submitted,
};
pub use snapshot::Snapshot;
pub use storage::{LocalDisk, Storage, StoragePath};
pub use verify::{read_manifest, read_part, verify_checkpoint};
