//! Section 2 of the report, persist throughput: the engine persisting parts already in memory
//! beside a plain `write` + `fsync` floor of the same bytes, alternating.

use std::{fmt::Write as _, path::Path};

use anyhow::Result;
use burn_ckpt::ckpt_core::Retention;
use ckpt_demo::perf::{engine_persist, persist_parts, write_fsync_floor};

use crate::{
    progress::Progress,
    report::Inputs,
    stall::open_engine,
    stats::{mb, med_range, median, ms, num},
};

#[derive(Debug, Clone)]
/// Section 2 samples: the engine and the write + fsync floor, alternating.
pub(crate) struct PersistRow {
    pub bytes: u64,
    pub floor_ms: Vec<f64>,
    pub engine_ms: Vec<f64>,
}

impl PersistRow {
    /// Engine throughput as a fraction of the floor's (median floor time / median engine time).
    pub(crate) fn ratio(&self) -> f64 {
        median(&self.floor_ms) / median(&self.engine_ms)
    }

    /// The floor's throughput in MB/s (medians).
    pub(crate) fn floor_mbps(&self) -> f64 {
        mb(self.bytes as f64) / (median(&self.floor_ms) / 1e3)
    }
}

/// Persists `total` bytes in 8 parts `reps` times each way, under `tmp`.
pub(crate) fn measure(total: usize, reps: usize, tmp: &Path, p: &Progress) -> Result<PersistRow> {
    let parts = persist_parts(total, 8);
    let root = tmp.join("persist-engine");
    let mut engine = open_engine(&root, Retention::keep_all())?;
    let mut row = PersistRow {
        bytes: total as u64,
        floor_ms: vec![],
        engine_ms: vec![],
    };
    // Warm-up of both, then alternate.
    write_fsync_floor(&tmp.join("persist-floor-w"), &parts)?;
    engine_persist(&mut engine, 1, &parts)?;
    for i in 0..reps {
        p.status(format!("persist: {}/{reps}", i + 1));
        let d = tmp.join(format!("persist-floor-{i}"));
        row.floor_ms.push(ms(write_fsync_floor(&d, &parts)?));
        row.engine_ms
            .push(ms(engine_persist(&mut engine, i as u64 + 2, &parts)?.0));
        p.done_unit();
    }
    engine.finish()?;
    let _ = std::fs::remove_dir_all(&root);
    p.line(format!(
        "persist {:.0} MB: engine {} ms vs write+fsync floor {} ms (medians)",
        mb(total as f64),
        num(median(&row.engine_ms)),
        num(median(&row.floor_ms))
    ));
    Ok(row)
}

/// Writes section 2.
pub(crate) fn write_section(w: &mut String, i: &Inputs) {
    let persist_ratio = i.persist.ratio();
    let floor_mbps = i.persist.floor_mbps();
    let _ = writeln!(w, "## 2. Persist throughput\n");
    let eng_mbps = mb(i.persist.bytes as f64) / (median(&i.persist.engine_ms) / 1e3);
    let _ = writeln!(
        w,
        "{:.0} MB in 8 parts, already in memory, to the same filesystem ({}), alternating. \
         Floor: each part written to a new file in 8 MiB writes, fsynced, then the directory \
         fsynced. Engine: `Engine::submit` to published (temporary directory, XXH3 of each part, \
         writeback started every 8 MiB, fsyncs, manifest, rename, root fsync, `latest`).\n",
        mb(i.persist.bytes as f64),
        i.args
            .dir
            .as_ref()
            .map_or("target/bench-report".into(), |d| d.display().to_string())
    );
    let _ = writeln!(
        w,
        "| engine / floor throughput | engine MB/s | floor MB/s | engine ms | floor ms |\n|---|---|---|---|---|\n| **{:.2}** | {:.0} | {:.0} | {} | {} |\n",
        persist_ratio,
        eng_mbps,
        floor_mbps,
        med_range(&i.persist.engine_ms),
        med_range(&i.persist.floor_ms)
    );
}
