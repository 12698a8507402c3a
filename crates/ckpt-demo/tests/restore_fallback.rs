//! Restore falls back past a corrupt newest checkpoint, and names the file when asked for it.

use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use ckpt_burn::{Error, MODEL_FILE, OPTIM_FILE, latest_valid, restore, restore_latest};
use ckpt_core::{Engine, EngineConfig, Retention, layout::checkpoint_dir_name};
use ckpt_demo::perf::{StateSize, TrainState};
use test_support::fs::{At, flip_byte};

const SMALL: StateSize = StateSize {
    label: "test",
    hidden: 8,
    layers: 2,
};

fn fresh(st: &TrainState) -> (ckpt_demo::Mlp, ModuleOptimizer, ModuleLrScheduler) {
    let model = ckpt_demo::Mlp::new(SMALL.hidden, SMALL.layers, 0.1, &st.device);
    let sched = ckpt_demo::model::scheduler(1e-3).expect("scheduler");
    (model, ckpt_demo::model::optimizer(), sched)
}

#[test]
fn restore_latest_falls_back_past_a_corrupt_newest_checkpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let mut st = TrainState::new(SMALL).expect("state");
    let (mut engine, _) =
        Engine::open(EngineConfig::new(&root).retention(Retention::keep_all())).expect("engine");
    st.save_sync(&mut engine).expect("save 1");
    st.train_step();
    st.save_sync(&mut engine).expect("save 2");
    engine.finish().expect("finish");

    let (model, optim, sched) = fresh(&st);
    let r = restore_latest(&root, model, optim, sched)
        .expect("restore")
        .expect("a checkpoint");
    assert_eq!(r.trainer.step, 2);

    // One flipped byte in the newest optimizer state: the older checkpoint is restored.
    let newest = root.join(checkpoint_dir_name(2));
    let optim_path = newest.join(OPTIM_FILE);
    flip_byte(&optim_path, At::Middle, 0x01);
    assert_eq!(
        latest_valid(&root).expect("latest"),
        Some(root.join(checkpoint_dir_name(1)))
    );
    let (model, optim, sched) = fresh(&st);
    let r = restore_latest(&root, model, optim, sched)
        .expect("restore")
        .expect("a checkpoint");
    assert_eq!(r.trainer.step, 1);
    assert_eq!(r.dir, root.join(checkpoint_dir_name(1)));

    // Restoring the corrupt one directly names the file.
    let (model, optim, sched) = fresh(&st);
    let e = restore(&newest, model, optim, sched).expect_err("corrupt");
    assert!(
        e.to_string().contains(&optim_path.display().to_string()),
        "{e}"
    );

    // A model of another shape is an error, not a reason to fall back.
    let other = ckpt_demo::Mlp::new(SMALL.hidden * 2, SMALL.layers, 0.1, &st.device);
    let (_, optim, sched) = fresh(&st);
    let e = restore_latest(&root, other, optim, sched).expect_err("mismatch");
    assert!(matches!(e, Error::ModelMismatch { .. }), "{e}");

    // Nothing valid left: None.
    std::fs::remove_file(root.join(checkpoint_dir_name(1)).join(MODEL_FILE)).expect("rm");
    let (model, optim, sched) = fresh(&st);
    assert!(
        restore_latest(&root, model, optim, sched)
            .expect("restore")
            .is_none()
    );
    assert_eq!(latest_valid(&root).expect("latest"), None);
}
