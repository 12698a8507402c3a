//! Section 5 of the report, peak extra memory: the resident-set growth of a save (each route,
//! and one within the budget) over a plain training step, against the
//! 1 GiB budget ([`crate::cli::SECTION_BUDGET`]).

use std::fmt::Write as _;

use anyhow::Result;
use burn_ckpt::ckpt_core::SaveRoute;
use ckpt_demo::perf::{MemorySampler, TrainState, proc_status_bytes, reset_peak_rss};

use crate::{
    progress::Progress,
    report::Inputs,
    stall::Savers,
    stats::{mb, route_name},
};

#[derive(Debug, Default, Clone)]
/// Section 5 samples of one state size.
pub(crate) struct MemRow {
    /// Peak RSS growth over a plain training step (the reference).
    pub step_peak: u64,
    /// Peak RSS growth over save + next step + persist, per mode.
    pub async_peak: u64,
    pub sync_peak: u64,
    pub burn_peak: u64,
    /// A save within the trainer's default memory budget ([`Inputs::staging_budget`]):
    /// its peak and the route it took.
    pub budget_peak: u64,
    pub budget_route: Option<SaveRoute>,
    /// Whether the high-water mark could be reset around each measurement.
    pub hwm_reset: bool,
}

impl MemRow {
    /// `peak` over the plain training step.
    pub(crate) fn extra(&self, peak: u64) -> u64 {
        peak.saturating_sub(self.step_peak)
    }
}

/// Peak memory growth while `f` runs, in bytes: the resident set's high-water mark, or where
/// more, the resident set plus what tmpfs gained (a save's scratch files in `/dev/shm`, which
/// no RSS shows), sampled every 5 ms ([`MemorySampler`]).
pub(crate) fn peak_growth(reset_ok: &mut bool, f: impl FnOnce() -> Result<()>) -> Result<u64> {
    *reset_ok &= reset_peak_rss();
    let base = proc_status_bytes("VmRSS").unwrap_or(0);
    let sampler = MemorySampler::start(std::process::id());
    let ran = f();
    let sampled = sampler.stop();
    ran?;
    let hwm = proc_status_bytes("VmHWM").unwrap_or(0);
    Ok(hwm.max(sampled).saturating_sub(base))
}

/// Measures the memory of each route on `st` (`budget`: the trainer's default memory budget).
pub(crate) fn measure(
    st: &mut TrainState,
    sv: &mut Savers,
    budget: u64,
    l: &str,
    p: &Progress,
) -> Result<MemRow> {
    // Memory: peak RSS growth of a plain step, then of save + next step + persist.
    p.status(format!("{l}: memory"));
    let mut mem = MemRow {
        hwm_reset: true,
        ..Default::default()
    };
    mem.step_peak = peak_growth(&mut mem.hwm_reset, || {
        st.train_step();
        Ok(())
    })?;
    mem.async_peak = peak_growth(&mut mem.hwm_reset, || {
        st.save_async(&mut sv.ea)?;
        st.train_step();
        sv.ea.wait_idle()?;
        Ok(())
    })?;
    let mut route = None;
    mem.budget_peak = peak_growth(&mut mem.hwm_reset, || {
        route = Some(st.save_within(&mut sv.ea, budget)?.1);
        st.train_step();
        sv.ea.wait_idle()?;
        Ok(())
    })?;
    mem.budget_route = route;
    mem.sync_peak = peak_growth(&mut mem.hwm_reset, || {
        st.save_sync(&mut sv.es)?;
        st.train_step();
        Ok(())
    })?;
    mem.burn_peak = peak_growth(&mut mem.hwm_reset, || {
        st.save_burn(&sv.burn_root)?;
        st.train_step();
        Ok(())
    })?;
    p.done_unit();
    p.line(format!(
        "memory {l}: extra peak memory async {:.0} MB, within budget {:.0} MB ({:?}), sync {:.0} MB, burn {:.0} MB",
        mb(mem.extra(mem.async_peak) as f64),
        mb(mem.extra(mem.budget_peak) as f64),
        mem.budget_route,
        mb(mem.extra(mem.sync_peak) as f64),
        mb(mem.extra(mem.burn_peak) as f64),
    ));
    Ok(mem)
}

/// Writes section 5.
pub(crate) fn write_section(w: &mut String, i: &Inputs) {
    let _ = writeln!(w, "## 5. Peak extra memory\n");
    let reset = i.stall.iter().all(|r| r.mem.hwm_reset);
    let _ = writeln!(
        w,
        "Peak memory: the process's resident-set high-water mark (`VmHWM`, /proc/self/status), \
         {}, or where more, the resident set plus what tmpfs gained (`Shmem` of /proc/meminfo: a \
         save's scratch files go to `/dev/shm`, memory no RSS shows), sampled every 5 ms; growth \
         over the resident set before: save + the next training step + waiting for the persist, minus \
         the growth of a plain training step (its gradients and activations). Budget: \
         {:.0} MB (1024 MiB, the trainer's default `--snapshot-budget-mb` before it became \
         `auto`). One \
         measurement per mode and size; allocator reuse of freed memory makes small sizes read \
         low.\n",
        if reset {
            "reset before each measurement through /proc/self/clear_refs"
        } else {
            "**not resettable here**, so later rows read the process peak so far"
        },
        mb(i.staging_budget as f64)
    );
    let _ = writeln!(
        w,
        "| state | within budget: extra MB | route | x state | async, no budget: extra MB | x state | sync extra MB | Burn extra MB | plain step growth MB |\n|---|---|---|---|---|---|---|---|---|"
    );
    for r in i.stall {
        let m = &r.mem;
        let _ = writeln!(
            w,
            "| {} | **{:.0}** | {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} |",
            r.size.label,
            mb(m.extra(m.budget_peak) as f64),
            route_name(m.budget_route),
            m.extra(m.budget_peak) as f64 / r.bytes as f64,
            mb(m.extra(m.async_peak) as f64),
            m.extra(m.async_peak) as f64 / r.bytes as f64,
            mb(m.extra(m.sync_peak) as f64),
            mb(m.extra(m.burn_peak) as f64),
            mb(m.step_peak as f64),
        );
    }
    let _ = writeln!(
        w,
        "\nWhere a save's memory goes: every save here goes through the library's own save path \
         (`FrozenState::submit`, what the trainer, the learner strategy and `CheckpointManager` \
         call; *sync* encodes on the training thread). The files are encoded as a stream (one \
         tensor at a time into the checksumming writer), so no file is ever buffered whole. A \
         background save holds handle clones, and while training continues every replaced \
         tensor stays held (copy-on-write; the model's tensors are released as they are \
         written). Burn's `OptimizerRecord`, its only public view of optimizer state, is \
         materialized whole (`to_record` copies the moments out) and streamed to a scratch file \
         tensor by tensor (`OptimizerRecord::save`, each freed once written), then into the \
         part. So a background save holds at most about one state (model + optimizer) beyond \
         training's own, which is what the gate counts (`FrozenState::memory`, \
         `ckpt_core::MemoryGate::route`). Under a budget a save whose peak does not fit is \
         throttled: submitted, then training waits until what it still holds fits the budget, \
         or until it holds only the optimizer record, which no route through Burn's public API \
         avoids (the floor; a budget below it is exceeded by the difference, with a warning).\n"
    );
}
