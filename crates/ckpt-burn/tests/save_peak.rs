//! A background save's peak memory on host memory. Burn 0.22.1's `OptimizerRecord::into_bytes`
//! holds the encoded optimizer record twice for a moment (its buffer, then an aligned copy of
//! it), so the staging helper encodes the record only once the model part is written: that
//! moment must not also hold the staged model.
//!
//! One test in this binary: it counts every allocation of the process.

// Only `freeze` of the shared helpers is used here.
#[allow(dead_code)]
mod common;

use ckpt_core::{Engine, EngineConfig};
use ckpt_demo::perf::{StateSize, TrainState};
use common::freeze;

#[global_allocator]
static ALLOC: test_support::alloc::Counting = test_support::alloc::Counting::new();

#[test]
fn the_record_is_encoded_only_once_the_staged_model_is_written() {
    let mut st = TrainState::new(StateSize {
        label: "peak",
        hidden: 2048,
        layers: 4,
    })
    .unwrap();
    st.train_step();
    let model = freeze(&st).model_bytes() as usize;
    // AdamW: two moments per parameter.
    let optim = 2 * model;

    let root = tempfile::tempdir().unwrap();
    let (mut engine, _) = Engine::open(EngineConfig::new(root.path())).unwrap();
    // A first save allocates what the engine keeps for the next ones (write buffers).
    engine.submit(freeze(&st).into_snapshot()).unwrap();
    engine.wait_idle().unwrap();
    st.train_step();

    // The persist thread sleeps before its first file, so the staging helper has staged the
    // model long before the model part is written.
    fail::cfg(ckpt_core::failpoints::WRITE_PART, "1*sleep(1500)").unwrap();
    let frozen = freeze(&st);
    let before = ALLOC.live();
    ALLOC.reset_peak();
    engine.submit(frozen.into_snapshot()).unwrap();
    let done = engine.wait_idle();
    fail::remove(ckpt_core::failpoints::WRITE_PART);
    done.unwrap();
    let extra = ALLOC.peak().saturating_sub(before);

    let mib = |b: usize| b >> 20;
    // The record and its encoding's buffer are counted whole at once whatever the order: the
    // measure sees the save.
    assert!(
        extra >= 2 * optim * 9 / 10,
        "the save allocated {} MiB at its peak, less than twice the {} MiB record",
        mib(extra),
        mib(optim)
    );
    // Twice the record plus the write buffers; with the staged model also still there it
    // would be the model's size more.
    assert!(
        extra < 2 * optim + model / 2,
        "the save allocated {} MiB at its peak: twice the {} MiB optimizer record and part of the \
         {} MiB model at once",
        mib(extra),
        mib(optim),
        mib(model)
    );
}
