//! The object-store tier of a run (`--upload-to URL`, feature `remote`): every checkpoint the
//! engine publishes is queued for upload (on ZeRO ranks, every rank uploads its part of each
//! sharded checkpoint, through `ckpt_zero::upload`); a resume restores the newest valid remote
//! checkpoint when it is newer than the newest valid local one. Without the feature, asking
//! for it is a configuration error.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use ckpt_core::{Engine, SaveEvent};

use crate::{DemoConfig, Result, UploadRecord};

/// A ZeRO rank's uploader, when `--upload-to` is set: uploads this rank's part of each
/// sharded checkpoint; the saver's hook queues the work. (The single-device trainer's tier is
/// the library's: [`ckpt_burn::ManagerConfig::upload_to`].)
pub(crate) struct Tier {
    #[cfg(feature = "remote")]
    up: Option<ckpt_zero::upload::ShardUploader>,
    /// Finished uploads, shared with the report.
    pub(crate) done: Arc<Mutex<Vec<UploadRecord>>>,
}

#[cfg(feature = "remote")]
impl Tier {
    /// The remote prefix of `cfg`, when it has one.
    fn remote(cfg: &DemoConfig) -> Result<Option<ckpt_remote::Remote>> {
        let Some(url) = &cfg.upload_to else {
            return Ok(None);
        };
        Ok(Some(ckpt_remote::Remote::open(url, remote_config(cfg))?))
    }

    /// A ZeRO rank's tier: starts this rank's part of the sharded uploads over `group` (its
    /// own, split in the same order on every rank). Returns the hook that queues each
    /// published checkpoint, for `ShardedSaver::start_with`. Nothing without a URL; `group`
    /// is only used with one.
    pub(crate) fn sharded(
        cfg: &DemoConfig,
        group: impl FnOnce() -> Result<Box<dyn ckpt_zero::collective::Collective>>,
    ) -> Result<(Self, Option<ckpt_zero::AfterPublish>)> {
        let (up, hook) = match Self::remote(cfg)? {
            Some(r) => {
                let u = ckpt_zero::upload::ShardUploader::start(group()?, r)?;
                let hook = u.after_publish();
                (Some(u), Some(hook))
            }
            None => (None, None),
        };
        Ok((
            Self {
                up,
                done: Arc::default(),
            },
            hook,
        ))
    }

    /// Collects finished uploads (the saver's hook queues them); the first upload failure as
    /// an error.
    pub(crate) fn published(&mut self, _events: &[SaveEvent]) -> Result<()> {
        let done = match &mut self.up {
            None => return Ok(()),
            Some(up) => up.poll()?,
        };
        self.record(&done);
        Ok(())
    }

    /// Waits for every queued upload; the record becomes every upload of the run.
    pub(crate) fn finish(&mut self) -> Result<()> {
        let all = match self.up.take() {
            None => return Ok(()),
            Some(up) => up.finish()?,
        };
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

/// The object-store settings of `cfg`'s flags.
#[cfg(feature = "remote")]
fn remote_config(cfg: &DemoConfig) -> ckpt_remote::RemoteConfig {
    ckpt_remote::RemoteConfig {
        keep_last: cfg.upload_keep_last.or(cfg.keep_last),
        max_bytes_per_sec: cfg.upload_max_mbps.map(|m| (m * 1e6) as u64),
        ..Default::default()
    }
}

/// The single-device trainer's object-store tier: the library's, with `cfg`'s settings.
#[cfg(feature = "remote")]
pub(crate) fn upload_to(
    m: ckpt_burn::ManagerConfig,
    url: &str,
    cfg: &DemoConfig,
) -> Result<ckpt_burn::ManagerConfig> {
    Ok(m.upload_to(url, remote_config(cfg)))
}

/// Without the `remote` feature: `--upload-to` is an error.
#[cfg(not(feature = "remote"))]
pub(crate) fn upload_to(
    _m: ckpt_burn::ManagerConfig,
    _url: &str,
    _cfg: &DemoConfig,
) -> Result<ckpt_burn::ManagerConfig> {
    Err(needs_feature())
}

/// The error of `--upload-to` in a build without the `remote` feature.
#[cfg(not(feature = "remote"))]
fn needs_feature() -> crate::Error {
    crate::Error::Config(
        "--upload-to needs a build with the `remote` feature (cargo run --features remote ...)"
            .into(),
    )
}

#[cfg(not(feature = "remote"))]
impl Tier {
    /// Without the `remote` feature: an error when `--upload-to` is set.
    pub(crate) fn sharded(
        cfg: &DemoConfig,
        _group: impl FnOnce() -> Result<Box<dyn ckpt_zero::collective::Collective>>,
    ) -> Result<(Self, Option<ckpt_zero::AfterPublish>)> {
        if cfg.upload_to.is_some() {
            return Err(needs_feature());
        }
        Ok((
            Self {
                done: Arc::default(),
            },
            None,
        ))
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

/// For a resume of `cfg` (with `--upload-to`): restores the newest valid remote checkpoint
/// newer than `local` (the newest valid local one) into the engine's root. Returns the
/// restored directory and the URL it came from, or None to resume from `local`.
#[cfg(feature = "remote")]
pub(crate) fn restore(
    cfg: &DemoConfig,
    engine: &mut Engine,
    local: Option<&Path>,
) -> Result<Option<(PathBuf, String)>> {
    let Some(remote) = Tier::remote(cfg)? else {
        return Ok(None);
    };
    let local_step = local
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(ckpt_core::layout::parse_step_dir);
    match remote.restore_newest(engine, local_step)? {
        Some(r) => {
            let from = format!(
                "{}/{}",
                remote.url(),
                ckpt_core::layout::checkpoint_dir_name(r.step)
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

/// Nothing to restore without the `remote` feature.
#[cfg(not(feature = "remote"))]
pub(crate) fn restore(
    _cfg: &DemoConfig,
    _engine: &mut Engine,
    _local: Option<&Path>,
) -> Result<Option<(PathBuf, String)>> {
    Ok(None)
}
