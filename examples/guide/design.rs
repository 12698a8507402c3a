//! The snippets of `docs/design.md`.

/// "The publication protocol": the engine alone, one part.
#[rustfmt::skip] // verbatim from docs/design.md
fn engine_alone() -> anyhow::Result<()> {
    use burn_ckpt::ckpt_core::{Engine, EngineConfig, Snapshot, read_latest, verify_checkpoint};

    let (mut engine, recovery) = Engine::open(EngineConfig::new("runs/x/ckpt"))?; // lock, then recovery
    engine.submit(Snapshot::new(10).with_bytes("state.bin", vec![0u8; 1024]))?;
    engine.finish()?;                                          // step-00000010 published
    let latest = read_latest("runs/x/ckpt")?;                  // Some("step-00000010")
    let manifest = verify_checkpoint("runs/x/ckpt/step-00000010")?; // every size and XXH3
    Ok(())
}
