//! The object-store tier of a [`crate::CheckpointManager`] (feature `remote`): every
//! checkpoint the engine publishes is queued for upload on `ckpt_remote`'s own threads, and a
//! resume restores the newest valid remote checkpoint when no valid local one is as new.

use std::path::PathBuf;

use crate::{Result, UploadRecord};
use ckpt_core::{Engine, SaveEvent};

impl UploadRecord {
    /// The record of a finished upload.
    pub fn of(u: &ckpt_remote::Uploaded) -> Self {
        Self {
            step: u.step,
            bytes: u.bytes,
            ms: u.elapsed.as_secs_f64() * 1e3,
        }
    }
}

/// A run's uploader: whole checkpoints, one after another, in the background.
pub(crate) struct UploadTier {
    remote: ckpt_remote::Remote,
    up: Option<ckpt_remote::Uploader>,
    done: Vec<UploadRecord>,
}

impl UploadTier {
    /// Opens `url` and starts its uploader.
    pub(crate) fn open(url: &str, config: ckpt_remote::RemoteConfig) -> Result<Self> {
        let remote = ckpt_remote::Remote::open(url, config.clone())?;
        let up = ckpt_remote::Uploader::start(ckpt_remote::Remote::open(url, config)?)?;
        Ok(Self {
            remote,
            up: Some(up),
            done: Vec::new(),
        })
    }

    /// Queues the uploads of `events` and collects finished ones; the first upload failure as
    /// an error.
    pub(crate) fn published(&mut self, events: &[SaveEvent]) -> Result<()> {
        if let Some(up) = &mut self.up {
            for ev in events {
                up.submit(ev.step, &ev.path)?;
            }
            let done = up.poll()?;
            self.done.extend(done.iter().map(UploadRecord::of));
        }
        Ok(())
    }

    /// Waits for every queued upload; returns every upload of the run.
    pub(crate) fn finish(&mut self) -> Result<Vec<UploadRecord>> {
        if let Some(up) = self.up.take() {
            // `finish` reports every upload of the run, those `poll` returned included.
            self.done = up.finish()?.iter().map(UploadRecord::of).collect();
        }
        Ok(std::mem::take(&mut self.done))
    }

    /// Restores into `engine`'s root the newest valid remote checkpoint newer than
    /// `local_step` (the newest valid local one); its directory and the URL it came from, or
    /// `None` to resume from the local one.
    pub(crate) fn restore(
        &self,
        engine: &mut Engine,
        local_step: Option<u64>,
    ) -> Result<Option<(u64, PathBuf, String)>> {
        match self.remote.restore_newest(engine, local_step)? {
            Some(r) => {
                let from = format!(
                    "{}/{}",
                    self.remote.url(),
                    ckpt_core::layout::checkpoint_dir_name(r.step)
                );
                tracing::warn!(
                    step = r.step,
                    local = ?local_step,
                    "restored the checkpoint from {from}: no valid local checkpoint is as new"
                );
                Ok(Some((r.step, r.event.path, from)))
            }
            None => Ok(None),
        }
    }
}
