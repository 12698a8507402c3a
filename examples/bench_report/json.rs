//! `library.json`: every sample of every section, with the run's description.

use serde_json::json;

use crate::{machine::machine, report::Inputs};

/// The raw samples as JSON.
pub(crate) fn write_json(i: &Inputs) -> serde_json::Value {
    json!({
        "command": i.cmdline,
        "started": i.started,
        "machine": machine(),
        "load_before": i.load_before,
        "load_after": i.load_after,
        "elapsed_s": i.elapsed.as_secs_f64(),
        "stall": i.stall.iter().map(|r| json!({
            "size": r.size.label, "hidden": r.size.hidden, "layers": r.size.layers,
            "state_bytes": r.bytes,
            "async_ms": r.async_ms, "async_capture_snapshot_submit_ms": r.async_parts_ms,
            "sync_ms": r.sync_ms, "burn_ms": r.burn_ms,
            "clone_ms": r.clone_ms, "memcpy_ms": r.memcpy_ms,
            "plain_step_ms": r.plain_step_ms, "next_step_ms": r.next_step_ms,
            "to_durable_ms": r.to_durable_ms, "persist_ms": r.persist_ms,
            "checkpoint_bytes": r.ckpt_bytes,
            "restore_ms": r.restore_ms, "read_floor_ms": r.read_ms,
            "verified_read_ms": r.verified_ms, "read_bytes": r.read_bytes,
            "memory": {
                "step_peak_bytes": r.mem.step_peak, "async_peak_bytes": r.mem.async_peak,
                "sync_peak_bytes": r.mem.sync_peak, "burn_peak_bytes": r.mem.burn_peak,
                "budget_peak_bytes": r.mem.budget_peak,
                "budget_route": r.mem.budget_route,
                "hwm_reset": r.mem.hwm_reset,
            },
        })).collect::<Vec<_>>(),
        "persist": {
            "bytes": i.persist.bytes, "floor_ms": i.persist.floor_ms,
            "engine_ms": i.persist.engine_ms,
        },
        "e2e": {
            "hidden": i.e2e_shape.hidden, "layers": i.e2e_shape.layers,
            "steps": i.e2e_shape.steps,
            "runs": i.e2e.iter().map(|r| json!({
                "name": r.name, "save_mode": r.mode, "budget": r.budget, "fixed": r.fixed,
                "train_ms": r.train_ms(), "report": r.report,
            })).collect::<Vec<_>>(),
        },
        "zero": i.zero.iter().map(|z| json!({
            "format": z.format.layout(), "persist_ms": z.persist_ms, "stall_ms": z.stall_ms,
            "bytes": z.bytes,
        })).collect::<Vec<_>>(),
        "staging_budget": i.staging_budget,
    })
}
