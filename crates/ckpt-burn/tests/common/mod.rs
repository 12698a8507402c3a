//! What the background-save tests of this crate share: a tiny trained state, its capture, and
//! the check that a checkpoint on disk holds exactly the bytes of a blocking save.

use std::path::Path;

use ckpt_burn::{EncodedState, FrozenState, MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE};
use ckpt_core::layout::checkpoint_dir_name;
use ckpt_demo::Mlp;
use ckpt_demo::perf::{StateSize, TrainState};

/// A three-layer MLP with AdamW, one step trained (so the optimizer has moments).
pub(crate) fn trained_tiny() -> TrainState {
    let mut st = TrainState::new(StateSize {
        label: "tiny",
        hidden: 64,
        layers: 3,
    })
    .unwrap();
    st.train_step();
    st
}

/// Captures `st` as it is now.
pub(crate) fn freeze(st: &TrainState) -> FrozenState<Mlp> {
    FrozenState::capture(&st.model, &st.optim, &st.sched, st.trainer())
}

/// Asserts that the checkpoint of `step` under `root` holds `want`'s bytes, file by file.
pub(crate) fn assert_checkpoint_is(root: &Path, step: u64, want: &EncodedState) {
    let dir = root.join(checkpoint_dir_name(step));
    for (file, bytes) in [
        (MODEL_FILE, &want.model),
        (OPTIM_FILE, &want.optim),
        (SCHEDULER_FILE, &want.scheduler),
        (TRAINER_FILE, &want.trainer),
    ] {
        let got = std::fs::read(dir.join(file)).unwrap();
        assert!(&got == bytes, "{file} is not the step-{step} state");
    }
}
