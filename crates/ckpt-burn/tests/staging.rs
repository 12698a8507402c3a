//! A background save told to stage the model ([`ModelStaging::Stage`]; on host memory the
//! default holds it for the writer, on a device it is always staged) stages the state to host
//! memory by itself once an engine accepts its snapshot: every handle the snapshot holds is released before anything is persisted, so the
//! next optimizer update writes in place, and what the snapshot writes later is still the
//! state of the step it was taken at.
//!
//! One test in this binary: it reads the process-wide [`pinned_state_bytes`] counter, which
//! another test's snapshots would move.

mod common;

use std::time::Duration;

use ckpt_burn::{ModelStaging, pinned_state_bytes, wait_pinned_at_most};
use ckpt_core::{Engine, EngineConfig};
use common::{assert_checkpoint_is, freeze, trained_tiny};

#[test]
fn staging_releases_the_state_before_the_persist_and_still_writes_the_captured_step() {
    let mut st = trained_tiny();
    let step = st.step;
    let want = freeze(&st).encode().unwrap();
    assert_eq!(pinned_state_bytes(), 0, "a blocking encode pins nothing");

    let frozen = freeze(&st).with_model_staging(ModelStaging::Stage);
    let state = frozen.model_bytes() * 3;
    let snapshot = frozen.into_snapshot();
    assert!(
        snapshot.held_bytes() >= state,
        "{} < {state}",
        snapshot.held_bytes()
    );

    // The engine takes the snapshot but its persist thread is held at the first file: nothing
    // persists yet. The staging, started when the engine accepted the snapshot, must give every
    // handle back by itself, and the wait a training loop takes before its next update returns
    // once it has.
    let root = tempfile::tempdir().unwrap();
    let (mut engine, _) = Engine::open(EngineConfig::new(root.path())).unwrap();
    fail::cfg(ckpt_core::failpoints::WRITE_PART, "pause").unwrap();
    engine.submit(snapshot).unwrap();
    let w = wait_pinned_at_most(0, Duration::from_secs(60));
    // Released before any assertion: a failure must not leave the persist thread paused (the
    // engine's drop would wait for it forever).
    fail::remove(ckpt_core::failpoints::WRITE_PART);
    assert!(
        !w.timed_out && w.still_pinned == 0,
        "{} bytes still pinned, with no persist running",
        w.still_pinned
    );
    assert_eq!(pinned_state_bytes(), 0);

    // The trainer moves on; with no clone left, AdamW updates its moments in place.
    for _ in 0..3 {
        st.train_step();
    }
    let later = freeze(&st).encode().unwrap();
    assert_ne!(later.model, want.model, "training did not move the model");
    assert_ne!(
        later.optim, want.optim,
        "training did not move the optimizer"
    );

    engine.wait_idle().unwrap();
    assert_checkpoint_is(root.path(), step, &want);
    assert_eq!(pinned_state_bytes(), 0);
}
