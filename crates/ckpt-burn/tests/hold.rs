//! A background save of host memory holds the model (the default on Flex): it keeps the
//! model's handles for the writer instead of staging them, and still writes the captured step
//! when training updates the model before the writer reads it (the update copies on write).
//!
//! One test in this binary: it reads the process-wide [`pinned_state_bytes`] counter, which
//! another test's snapshots would move.

mod common;

use std::time::Duration;

use ckpt_burn::{pinned_state_bytes, wait_pinned_at_most};
use ckpt_core::{Engine, EngineConfig};
use common::{assert_checkpoint_is, freeze, trained_tiny};

#[test]
fn a_held_model_is_written_as_captured_after_training_moved_on() {
    let mut st = trained_tiny();
    let step = st.step;
    let want = freeze(&st).encode().unwrap();

    let frozen = freeze(&st);
    let model_bytes = frozen.model_bytes();
    let snapshot = frozen.into_snapshot();

    // The persist thread is held at its first file, so nothing is written yet. The staging
    // helper takes the optimizer's record and gives its handles back; the model's stay held.
    let root = tempfile::tempdir().unwrap();
    let (mut engine, _) = Engine::open(EngineConfig::new(root.path())).unwrap();
    fail::cfg(ckpt_core::failpoints::WRITE_PART, "pause").unwrap();
    engine.submit(snapshot).unwrap();
    let w = wait_pinned_at_most(model_bytes, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    let held = pinned_state_bytes();

    // The trainer moves on before the writer has read the model: the update copies on write.
    for _ in 0..3 {
        st.train_step();
    }
    // Released before any assertion: a failure must not leave the persist thread paused (the
    // engine's drop would wait for it forever).
    fail::remove(ckpt_core::failpoints::WRITE_PART);
    assert!(!w.timed_out, "the optimizer's handles were not released");
    assert_eq!(
        held, model_bytes,
        "the snapshot should hold exactly the model's handles for the writer"
    );
    let later = freeze(&st).encode().unwrap();
    assert_ne!(later.model, want.model, "training did not move the model");

    engine.wait_idle().unwrap();
    assert_checkpoint_is(root.path(), step, &want);
    assert_eq!(
        pinned_state_bytes(),
        0,
        "the writer released the held model"
    );
}
