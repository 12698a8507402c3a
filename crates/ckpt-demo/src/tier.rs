//! The object-store tier of a run (`--upload-to URL`, feature `remote`): the trainer's flags
//! turned into the library's settings. The single-device trainer uploads through
//! [`ckpt_burn::ManagerConfig::upload_to`]; on ZeRO ranks every rank uploads its part of each
//! sharded checkpoint ([`ckpt_zero::RankConfig::upload_to`]), and a resume restores the newest
//! valid remote checkpoint when it is newer than the newest valid local one
//! ([`ckpt_zero::ShardedRoot::restore_from`]). Without the feature, asking for it is a
//! configuration error.

use crate::{DemoConfig, Result};

/// An object-store prefix.
#[cfg(feature = "remote")]
pub(crate) type Remote = ckpt_remote::Remote;

/// Without the `remote` feature there is no object store (no value of this type exists).
#[cfg(not(feature = "remote"))]
pub(crate) enum Remote {}

/// The remote prefix of `cfg` (`--upload-to`), when it has one.
#[cfg(feature = "remote")]
pub(crate) fn remote(cfg: &DemoConfig) -> Result<Option<Remote>> {
    let Some(url) = &cfg.upload_to else {
        return Ok(None);
    };
    Ok(Some(ckpt_remote::Remote::open(url, remote_config(cfg))?))
}

/// Without the `remote` feature: an error when `--upload-to` is set.
#[cfg(not(feature = "remote"))]
pub(crate) fn remote(cfg: &DemoConfig) -> Result<Option<Remote>> {
    match cfg.upload_to {
        Some(_) => Err(needs_feature()),
        None => Ok(None),
    }
}

/// A ZeRO rank's settings, uploading to `remote`.
#[cfg(feature = "remote")]
pub(crate) fn upload_shards(
    config: ckpt_zero::RankConfig,
    remote: Remote,
) -> ckpt_zero::RankConfig {
    config.upload_to(remote)
}

/// Without the `remote` feature there is no remote to upload to.
#[cfg(not(feature = "remote"))]
pub(crate) fn upload_shards(
    _config: ckpt_zero::RankConfig,
    remote: Remote,
) -> ckpt_zero::RankConfig {
    match remote {}
}

/// For a ZeRO resume: restores a newer valid checkpoint of `remote` into `root`.
#[cfg(feature = "remote")]
pub(crate) fn restore_newer(root: &mut ckpt_zero::ShardedRoot, remote: &Remote) -> Result<()> {
    Ok(root.restore_from(remote)?)
}

/// Without the `remote` feature there is no remote to restore from.
#[cfg(not(feature = "remote"))]
pub(crate) fn restore_newer(_root: &mut ckpt_zero::ShardedRoot, remote: &Remote) -> Result<()> {
    match *remote {}
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
