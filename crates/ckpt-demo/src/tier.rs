//! The object-store tier of a run (`--upload-to URL`, feature `remote`): every checkpoint the
//! engine publishes is queued for upload; a resume restores the newest valid remote checkpoint
//! when it is newer than the newest valid local one. Without the feature, asking for it is a
//! configuration error.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use ckpt_core::{Engine, SaveEvent};
use serde::Serialize;

use crate::{DemoConfig, Result};

/// One finished upload, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct UploadRecord {
    /// Step.
    pub step: u64,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Time the upload took, in milliseconds.
    pub ms: f64,
}

/// The run's uploader, when `--upload-to` is set.
pub(crate) struct Tier {
    #[cfg(feature = "remote")]
    up: Option<ckpt_remote::Uploader>,
    /// Finished uploads, shared with the report.
    pub(crate) done: Arc<Mutex<Vec<UploadRecord>>>,
}

#[cfg(feature = "remote")]
impl Tier {
    /// Opens the remote prefix of `cfg` and starts its uploader (nothing without a URL).
    pub(crate) fn open(cfg: &DemoConfig) -> Result<Self> {
        let up = match &cfg.upload_to {
            None => None,
            Some(url) => {
                let rc = ckpt_remote::RemoteConfig {
                    keep_last: cfg.upload_keep_last.or(cfg.keep_last),
                    max_bytes_per_sec: cfg.upload_max_mbps.map(|m| (m * 1e6) as u64),
                    ..Default::default()
                };
                Some(ckpt_remote::Uploader::start(ckpt_remote::Remote::open(
                    url, rc,
                )?)?)
            }
        };
        Ok(Self {
            up,
            done: Arc::default(),
        })
    }

    /// For a resume: restores the newest valid remote checkpoint newer than `local` (the
    /// newest valid local one) into the engine's root. Returns the restored directory and the
    /// URL it came from, or None to resume from `local`.
    pub(crate) fn restore(
        &self,
        engine: &mut Engine,
        local: Option<&Path>,
    ) -> Result<Option<(PathBuf, String)>> {
        let Some(up) = &self.up else { return Ok(None) };
        let local_step = local
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(ckpt_core::parse_step_dir);
        let remote = up.remote();
        match remote.restore_newest(engine, local_step)? {
            Some(r) => {
                let from = format!(
                    "{}/{}",
                    remote.url(),
                    ckpt_core::checkpoint_dir_name(r.step)
                );
                tracing::warn!(
                    step = r.step,
                    local = ?local_step,
                    "restored the checkpoint from {from}: no valid local checkpoint is as new"
                );
                Ok(Some((r.event.path, from)))
            }
            None => Ok(None),
        }
    }

    /// Queues the uploads of `events` and collects finished ones; the first upload failure
    /// as an error.
    pub(crate) fn published(&mut self, events: &[SaveEvent]) -> Result<()> {
        let Some(up) = &mut self.up else {
            return Ok(());
        };
        for ev in events {
            up.submit(ev.step, &ev.path)?;
        }
        let done = up.poll()?;
        self.record(&done);
        Ok(())
    }

    /// Waits for every queued upload; the record becomes every upload of the run.
    pub(crate) fn finish(&mut self) -> Result<()> {
        let Some(up) = self.up.take() else {
            return Ok(());
        };
        let all = up.finish()?;
        if let Ok(mut d) = self.done.lock() {
            d.clear();
        }
        self.record(&all);
        Ok(())
    }

    fn record(&self, done: &[ckpt_remote::Uploaded]) {
        if let Ok(mut d) = self.done.lock() {
            d.extend(done.iter().map(|u| UploadRecord {
                step: u.step,
                bytes: u.bytes,
                ms: u.elapsed.as_secs_f64() * 1e3,
            }));
        }
    }
}

#[cfg(not(feature = "remote"))]
impl Tier {
    /// Without the `remote` feature: an error when `--upload-to` is set.
    pub(crate) fn open(cfg: &DemoConfig) -> Result<Self> {
        if cfg.upload_to.is_some() {
            return Err(crate::Error::Config(
                "--upload-to needs a build with the `remote` feature (cargo run --features remote ...)"
                    .into(),
            ));
        }
        Ok(Self {
            done: Arc::default(),
        })
    }

    /// Nothing to restore without the feature.
    pub(crate) fn restore(
        &self,
        _engine: &mut Engine,
        _local: Option<&Path>,
    ) -> Result<Option<(PathBuf, String)>> {
        Ok(None)
    }

    /// Nothing to upload without the feature.
    pub(crate) fn published(&mut self, _events: &[SaveEvent]) -> Result<()> {
        Ok(())
    }

    /// Nothing to wait for without the feature.
    pub(crate) fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}
