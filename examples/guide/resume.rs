//! The snippets of `docs/resume.md`.

use std::path::Path;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;

/// "Resuming from a given step, or from elsewhere".
#[rustfmt::skip] // verbatim from docs/resume.md
fn restore_a_given_checkpoint<M: Module>(
    model: M,
    optim: ModuleOptimizer,
    sched: ModuleLrScheduler,
) -> anyhow::Result<()> {
    let r = burn_ckpt::ckpt_burn::restore(Path::new("runs/x/step-00000200"), model, optim, sched)?;
    let (model, optim, sched, state) = (r.model, r.optim, r.scheduler, r.trainer);
    Ok(())
}
