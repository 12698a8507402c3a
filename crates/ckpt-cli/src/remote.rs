//! `ckpt ls/verify/inspect/export/gc` on an object-store URL (`s3://bucket/prefix`, credentials and
//! endpoint from the `AWS_*` variables), through `ckpt-remote`.

use anyhow::{Result, bail};
use ckpt_remote::{Remote, RemoteConfig};

use crate::human;

/// True when `arg` names an object-store URL rather than a local path.
pub(crate) fn is_url(arg: &str) -> bool {
    arg.contains("://")
}

/// Splits `s3://b/p/step-00000012` into the prefix URL and the step; a prefix URL has none.
fn split_step(url: &str) -> (&str, Option<u64>) {
    let trimmed = url.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((prefix, last)) => match ckpt_core::layout::parse_step_dir(last) {
            Some(step) => (prefix, Some(step)),
            None => (trimmed, None),
        },
        None => (trimmed, None),
    }
}

fn open(url: &str) -> Result<Remote> {
    Ok(Remote::open(url, RemoteConfig::default())?)
}

/// `ckpt ls URL`.
pub(crate) fn ls(url: &str, json: bool) -> Result<()> {
    let remote = open(url)?;
    let list = remote.list()?;
    if json {
        let rows: Vec<_> = list
            .iter()
            .map(|c| {
                serde_json::json!({
                    "step": c.step,
                    "manifest": c.manifest_key,
                    "bytes": c.manifest.as_ref().map(|m| m.total_bytes()),
                    "latest": c.latest,
                    "valid": c.invalid.is_none(),
                    "problem": c.invalid,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no checkpoints in {url}");
        return Ok(());
    }
    println!("{:<16} {:>10} {:>10}  STATUS", "NAME", "STEP", "SIZE");
    for c in &list {
        let size = c
            .manifest
            .as_ref()
            .map(|m| human(m.total_bytes()))
            .unwrap_or_else(|| "-".into());
        let status = match &c.invalid {
            Some(r) => format!("INVALID: {r}"),
            None if c.latest => "ok (latest)".into(),
            None => "ok".into(),
        };
        println!(
            "{:<16} {:>10} {size:>10}  {status}",
            ckpt_core::layout::checkpoint_dir_name(c.step),
            c.step
        );
    }
    Ok(())
}

/// `ckpt verify URL`: every part of every checkpoint (or of one `.../step-*`) downloaded and
/// checked against its manifest, and `latest` naming a valid one.
pub(crate) fn verify(url: &str) -> Result<()> {
    let (prefix, step) = split_step(url);
    let remote = open(prefix)?;
    if let Some(step) = step {
        let m = remote.verify(step)?;
        println!(
            "OK   {url} (step {step}, {} files, {})",
            m.files.len(),
            human(m.total_bytes())
        );
        return Ok(());
    }
    let list = remote.list()?;
    if list.is_empty() {
        bail!("no checkpoints in {prefix}: nothing to verify");
    }
    let mut failures = 0;
    for c in &list {
        let shown = format!(
            "{prefix}/{}",
            ckpt_core::layout::checkpoint_dir_name(c.step)
        );
        let checked = match &c.invalid {
            Some(r) => Err(r.clone()),
            None => remote.verify(c.step).map_err(|e| e.to_string()),
        };
        match checked {
            Ok(m) => println!("OK   {shown} ({})", human(m.total_bytes())),
            Err(r) => {
                failures += 1;
                eprintln!("FAIL {r}");
            }
        }
    }
    if let Some(name) = remote.latest()?
        && !list.iter().any(|c| c.latest && c.invalid.is_none())
    {
        failures += 1;
        eprintln!("FAIL {prefix}/latest: names {name}, which is not a valid checkpoint");
    }
    if failures > 0 {
        bail!("{failures} problem(s) in {prefix}");
    }
    println!("{} checkpoint(s) verified in {prefix}", list.len());
    Ok(())
}

/// Downloads the checkpoint `URL/step-*` names, verified, into a temporary root: the root
/// (removed when dropped) and the checkpoint's directory in it.
fn download(url: &str) -> Result<(tempfile::TempDir, std::path::PathBuf)> {
    let (prefix, Some(step)) = split_step(url) else {
        bail!("{url}: name one checkpoint (.../step-NNNNNNNN)");
    };
    let remote = open(prefix)?;
    let tmp = tempfile::tempdir()?;
    let (mut engine, _) = ckpt_core::Engine::open(ckpt_core::EngineConfig::new(tmp.path()))?;
    let ev = remote.restore_into(&mut engine, step)?;
    engine.finish()?;
    Ok((tmp, ev.path))
}

/// `ckpt inspect URL/step-*`: downloads the checkpoint (verified) into a temporary root and
/// inspects it there.
pub(crate) fn inspect(url: &str, json: bool) -> Result<()> {
    let (_tmp, ckpt) = download(url)?;
    crate::inspect_cmd(&ckpt, json)
}

/// `ckpt export URL/step-* --to safetensors OUT`: downloads the checkpoint (verified) into a
/// temporary root and exports it from there. Returns the tensors written.
pub(crate) fn export(url: &str, out: &std::path::Path, with_optim: bool) -> Result<usize> {
    let (_tmp, ckpt) = download(url)?;
    crate::export::to_safetensors(&ckpt, out, with_optim)
}

/// `ckpt gc URL`: removes unpublished uploads (no valid manifest) and, with `keep_last`,
/// applies retention. Run it when no trainer uploads to the prefix.
pub(crate) fn gc(url: &str, keep_last: Option<usize>) -> Result<()> {
    let remote = open(url)?;
    for s in remote.garbage_collect()? {
        println!(
            "removed {url}/{} (unpublished)",
            ckpt_core::layout::checkpoint_dir_name(s)
        );
    }
    if let Some(n) = keep_last {
        for s in remote.prune(n)? {
            println!("removed step {s} (retention)");
        }
    }
    Ok(())
}
