//! Snapshots: an immutable set of named parts taken at one step boundary.
//!
//! Every part is owned by the snapshot (`Send + 'static`), so once [`crate::Engine::submit`]
//! has taken it the caller cannot reach it any more: the type system, not a convention, keeps
//! the trainer from mutating what the persist thread is writing.

use std::{collections::BTreeMap, io::Write, sync::Arc, time::Duration};

use crate::naming::{PartNameError, check_part_names};

/// Writes a part's bytes on the persist thread, from data that can no longer change (for
/// example held tensor handles whose updates allocate instead of writing in place).
pub trait PartProducer: Send + 'static {
    /// Writes the whole part into `sink`.
    fn write_into(
        self: Box<Self>,
        sink: &mut dyn Write,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

impl<F> PartProducer for F
where
    F: FnOnce(&mut dyn Write) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
        + Send
        + 'static,
{
    fn write_into(
        self: Box<Self>,
        sink: &mut dyn Write,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        (*self)(sink)
    }
}

/// The data of one part.
pub enum PartData {
    /// Owned bytes.
    Bytes(Vec<u8>),
    /// Shared immutable bytes.
    Shared(Arc<[u8]>),
    /// A producer that writes the bytes later, on the persist thread.
    Producer(Box<dyn PartProducer>),
    /// A file already written and fsynced (by another rank, say), moved into the checkpoint
    /// when it is published. It must be on the same filesystem as the checkpoint root.
    Adopted(crate::DurableFile),
}

impl std::fmt::Debug for PartData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PartData::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            PartData::Shared(b) => write!(f, "Shared({} bytes)", b.len()),
            PartData::Producer(_) => f.write_str("Producer"),
            PartData::Adopted(d) => write!(f, "Adopted({})", d.path.display()),
        }
    }
}

impl PartData {
    /// Length in bytes when known before writing.
    pub fn known_len(&self) -> Option<u64> {
        match self {
            PartData::Bytes(b) => Some(b.len() as u64),
            PartData::Shared(b) => Some(b.len() as u64),
            PartData::Producer(_) => None,
            PartData::Adopted(d) => Some(d.size),
        }
    }
}

/// One named file of a checkpoint.
#[derive(Debug)]
pub struct Part {
    /// File name inside the checkpoint directory (no separators).
    pub name: String,
    /// Its data.
    pub data: PartData,
    /// Extra memory this part pins until it is written, in bytes (see
    /// [`Snapshot::holding`]); 0 unless declared.
    pub holds: u64,
    /// Whether the part frees what it holds as it writes it, so that the engine gives
    /// [`Self::holds`] back as the bytes are written (see
    /// [`Snapshot::holding_released_as_written`]) rather than once the part is written.
    pub released_as_written: bool,
    /// Its share of the engine's held-memory ledger, given back when the part is dropped.
    pub(crate) guard: Option<crate::held::HoldGuard>,
}

/// The state of a training run at one step boundary, ready to persist.
#[derive(Debug)]
pub struct Snapshot {
    /// Global step the snapshot was taken after.
    pub step: u64,
    /// Epoch at that step.
    pub epoch: u64,
    /// Number of ranks that contributed.
    pub world_size: u32,
    /// Layout name recorded in the manifest (`single`, `consolidated`, `per-rank`).
    pub layout: String,
    /// Extra manifest entries.
    pub meta: BTreeMap<String, serde_json::Value>,
    /// The parts, written in this order.
    pub parts: Vec<Part>,
    /// Time the caller spent capturing this snapshot (counted in the reported stall).
    pub capture_time: Duration,
    /// Replace an already published checkpoint of the same step (atomically, never leaving
    /// the step without a valid copy) instead of failing with `AlreadyPublished`.
    pub replace: bool,
    /// Run once the engine accepts the snapshot ([`Snapshot::on_accepted`]).
    on_accepted: OnAccepted,
}

/// Callbacks run when an engine accepts a snapshot for its persist thread.
#[derive(Default)]
struct OnAccepted(Vec<Box<dyn FnOnce() + Send>>);

impl std::fmt::Debug for OnAccepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} callback(s)", self.0.len())
    }
}

impl Snapshot {
    /// An empty snapshot for `step`.
    pub fn new(step: u64) -> Self {
        Self {
            step,
            epoch: 0,
            world_size: 1,
            layout: "single".into(),
            meta: BTreeMap::new(),
            parts: Vec::new(),
            capture_time: Duration::ZERO,
            replace: false,
            on_accepted: OnAccepted::default(),
        }
    }

    /// Sets the epoch.
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }

    /// Sets the world size and layout name.
    pub fn with_layout(mut self, world_size: u32, layout: impl Into<String>) -> Self {
        self.world_size = world_size;
        self.layout = layout.into();
        self
    }

    /// Adds a manifest entry.
    pub fn with_meta(
        mut self,
        key: impl Into<String>,
        value: impl Into<serde_json::Value>,
    ) -> Self {
        self.meta.insert(key.into(), value.into());
        self
    }

    /// Adds a part.
    pub fn with_part(mut self, name: impl Into<String>, data: PartData) -> Self {
        self.parts.push(Part {
            name: name.into(),
            data,
            holds: 0,
            released_as_written: false,
            guard: None,
        });
        self
    }

    /// Declares that the part added last pins `bytes` of extra memory until it is written
    /// (held tensor handles that training would copy on update, a record the producer
    /// materializes). The engine counts declared bytes until each part is written
    /// ([`crate::Engine::held_bytes`]), which is what a trainer under a memory budget waits
    /// on. No effect on an empty snapshot.
    pub fn holding(mut self, bytes: u64) -> Self {
        if let Some(p) = self.parts.last_mut() {
            p.holds = bytes;
        }
        self
    }

    /// [`Self::holding`] for a part that frees what it holds as it writes it, such as staged
    /// tensors each dropped once written: the engine gives the declared bytes back as the
    /// part's bytes are written (at most what was written so far), so a trainer waiting under
    /// a memory budget goes on as soon as the excess is written, not the whole part. What is
    /// freed lags what is counted by at most the piece being written (one tensor).
    pub fn holding_released_as_written(mut self, bytes: u64) -> Self {
        if let Some(p) = self.parts.last_mut() {
            p.holds = bytes;
            p.released_as_written = true;
        }
        self
    }

    /// Bytes the parts declare they hold ([`Self::holding`]).
    pub fn held_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.holds).sum()
    }

    /// Adds an owned-bytes part.
    pub fn with_bytes(self, name: impl Into<String>, bytes: Vec<u8>) -> Self {
        self.with_part(name, PartData::Bytes(bytes))
    }

    /// Adds a file already written and fsynced by [`crate::write_durable_file`]; publishing
    /// moves it into the checkpoint directory.
    pub fn with_adopted(self, name: impl Into<String>, file: crate::DurableFile) -> Self {
        self.with_part(name, PartData::Adopted(file))
    }

    /// Adds a part whose bytes a producer writes on the persist thread.
    pub fn with_producer(self, name: impl Into<String>, producer: impl PartProducer) -> Self {
        self.with_part(name, PartData::Producer(Box::new(producer)))
    }

    /// Allows replacing an existing checkpoint of this step (e.g. after resuming from an
    /// earlier one and reaching this step again).
    pub fn with_replace(mut self, replace: bool) -> Self {
        self.replace = replace;
        self
    }

    /// Records how long capturing took on the training thread.
    pub fn with_capture_time(mut self, d: Duration) -> Self {
        self.capture_time = d;
        self
    }

    /// Runs `f` on the submitting thread once an engine accepts this snapshot for its persist
    /// thread: after the save call has decided to queue it (before any wait for a free persist
    /// slot), not when it is skipped, written on the calling thread, or dropped. For starting
    /// background work the snapshot's parts will need (a staging thread), so that a snapshot
    /// that is never queued costs nothing and the start lands at the end of the save call;
    /// `f` should return quickly.
    pub fn on_accepted(mut self, f: impl FnOnce() + Send + 'static) -> Self {
        self.on_accepted.0.push(Box::new(f));
        self
    }

    /// What [`Snapshot::on_accepted`] registered, to run later (once).
    pub(crate) fn take_accepted(&mut self) -> impl FnOnce() + use<> {
        let hooks = std::mem::take(&mut self.on_accepted.0);
        move || hooks.into_iter().for_each(|f| f())
    }

    /// Sum of the known part sizes.
    pub fn known_bytes(&self) -> u64 {
        self.parts.iter().filter_map(|p| p.data.known_len()).sum()
    }

    /// Checks part names: non-empty, no path separators, unique, not reserved (the rule every
    /// manifest is read with, too).
    pub fn validate(&self) -> crate::Result<()> {
        check_part_names(self.parts.iter().map(|p| p.name.as_str())).map_err(|e| {
            let reason = match e {
                PartNameError::NotPlain(n) => {
                    format!("part name {n:?} is not a plain, non-reserved file name")
                }
                PartNameError::Duplicate(n) => format!("part {n:?} appears twice"),
            };
            crate::Error::InvalidSnapshot {
                step: self.step,
                reason,
            }
        })
    }
}
