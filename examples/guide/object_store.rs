//! The snippets of `docs/object-store.md` (feature `remote`).

use burn_ckpt::EngineConfig;

/// "Turn it on" (`mut`: the loop that follows calls `ckpt.step`).
#[cfg(feature = "remote")]
#[allow(unused_mut)]
#[rustfmt::skip] // verbatim from docs/object-store.md
fn turn_it_on() -> anyhow::Result<()> {
    use burn_ckpt::ckpt_remote::RemoteConfig;
    use burn_ckpt::{CheckpointManager, ManagerConfig};

    let remote = RemoteConfig { keep_last: Some(10), max_bytes_per_sec: Some(200_000_000), ..Default::default() };
    let config = ManagerConfig::new("runs/x").every_steps(100).upload_to("s3://my-bucket/runs/x", remote);
    let mut ckpt = CheckpointManager::open(config)?;
    Ok(())
}

/// "Without CheckpointManager".
#[cfg(feature = "remote")]
#[rustfmt::skip] // verbatim from docs/object-store.md
fn without_manager() -> anyhow::Result<()> {
    use burn_ckpt::ckpt_core::Engine;
    use burn_ckpt::ckpt_remote::{Remote, RemoteConfig};

    let remote = Remote::open("s3://my-bucket/runs/x", RemoteConfig::default())?;
    let (mut engine, recovery) = Engine::open(EngineConfig::new("runs/x/ckpt"))?;
    let local = recovery.latest.map(|c| c.step);
    if let Some(restored) = remote.restore_newest(&mut engine, local)? {
        println!("downloaded step {}", restored.step);
    }
    engine.finish()?;                                  // releases the root for the training run
    Ok(())
}
