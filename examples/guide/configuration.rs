//! The snippets of `docs/configuration.md`.

use burn::tensor::Device;

/// "`ManagerConfig` (a loop of your own)".
#[rustfmt::skip] // verbatim from docs/configuration.md
fn manager_config() {
    use burn_ckpt::ckpt_core::SaveErrorPolicy;
    use burn_ckpt::{FrequencyPolicy, ManagerConfig, SaveTuning};

    let config = ManagerConfig::new("runs/x")
        .frequency(FrequencyPolicy::budget(0.02))           // default: every 100 steps
        .keep_last(Some(5))                                 // default: Some(3); None keeps all
        .seed(42)                                           // default 0, recorded in trainer.bin
        .end_step(10_000)                                   // always saved; step() returns true there
        .on_save_error(SaveErrorPolicy::Continue)           // default: Stop
        .tuning(SaveTuning::default().memory_budget(Some(8 << 30)));
}

/// "`EngineConfig` (the learner routes, ZeRO, the engine)".
#[rustfmt::skip] // verbatim from docs/configuration.md
fn engine_config(device: Device) -> anyhow::Result<()> {
    use burn_ckpt::{CkptCheckpointers, CkptTrainingStrategy, EngineConfig, FrequencyPolicy, Retention};

    let engine = EngineConfig::new("runs/x/ckpt")
        .retention(Retention::keep_last(3).with_keep_every(10_000))   // default: keep all
        .persist_nice(None);                                          // default: Some(10)
    let ckpt = CkptCheckpointers::open(engine)?;
    let strategy = CkptTrainingStrategy::new(device, &ckpt, FrequencyPolicy::EverySeconds(600.0))
        .save_at_epoch_end(false)                                     // default: true
        .resume_latest();
    Ok(())
}
