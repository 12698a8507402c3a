//! Section 4 of the report, time to durable and restore: restores the newest async checkpoint
//! of a state size, alternating with a plain read and a verified read of its files, and writes
//! the section beside the time to durable of the async saves of section 1.

use std::{fmt::Write as _, path::Path};

use anyhow::{Context, Result};
use ckpt_demo::perf::{read_floor, restore_time, verified_read_time};

use crate::{
    progress::Progress,
    report::Inputs,
    stall::StallRow,
    stats::{mb, med_range, median, ms, num},
};

/// Restores the newest checkpoint under `async_root` `restore_reps` times, alternating with
/// plain reads of its files, into `row`.
pub(crate) fn measure(
    row: &mut StallRow,
    async_root: &Path,
    restore_reps: usize,
    p: &Progress,
) -> Result<()> {
    let (l, size) = (row.size.label, row.size);
    // Restore the newest async checkpoint, alternating with plain reads of its files.
    p.status(format!("{l}: restore"));
    let dir = burn_ckpt::ckpt_burn::latest_valid(async_root)?
        .context("the async root has no valid checkpoint")?;
    for _ in 0..restore_reps {
        let (t, n) = read_floor(&dir)?;
        row.read_ms.push(ms(t));
        row.read_bytes = n;
        row.verified_ms.push(ms(verified_read_time(&dir)?));
        row.restore_ms.push(ms(restore_time(&dir, size)?));
    }
    p.done_unit();
    p.line(format!(
        "restore {l}: {} ms vs read floor {} ms",
        num(median(&row.restore_ms)),
        num(median(&row.read_ms))
    ));
    Ok(())
}

/// Writes section 4.
pub(crate) fn write_section(w: &mut String, i: &Inputs) {
    let floor_mbps = i.persist.floor_mbps();
    let _ = writeln!(w, "## 4. Time to durable and restore\n");
    let _ = writeln!(
        w,
        "Time to durable: `SaveEvent::to_durable` of the async saves in section 1 (submit to \
         published, encoding included, while the next training step runs). Restore: \
         `ckpt_burn::restore` of the newest async checkpoint into a fresh model, optimizer and \
         scheduler (reads, verifies every XXH3, decodes, loads), alternating with a read floor \
         (`std::fs::read` of the same files). Both read from the page cache (the files were just \
         written; caches are not dropped on a shared machine).\n"
    );
    let _ = writeln!(
        w,
        "| state | read floor / restore | read floor / verified read | to durable / write+fsync floor | to durable ms | persist-thread ms | restore ms | verified read ms | read floor ms | checkpoint MB |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in i.stall {
        let floor_ms = mb(r.ckpt_bytes as f64) / floor_mbps * 1e3;
        let _ = writeln!(
            w,
            "| {} | **{:.2}** | {:.2} | {:.2}x | {} | {} | {} | {} | {} | {:.1} |",
            r.size.label,
            median(&r.read_ms) / median(&r.restore_ms),
            median(&r.read_ms) / median(&r.verified_ms),
            median(&r.to_durable_ms) / floor_ms,
            med_range(&r.to_durable_ms),
            med_range(&r.persist_ms),
            med_range(&r.restore_ms),
            med_range(&r.verified_ms),
            med_range(&r.read_ms),
            mb(r.ckpt_bytes as f64),
        );
    }
    let _ = writeln!(
        w,
        "\n*to durable / write+fsync floor* compares with the floor throughput of section 2 \
         scaled to the checkpoint's bytes: above 1x is what the floor does not do, Burn's \
         record serialization (for the optimizer also a decode and re-encode into the \
         canonical, name-sorted layout) on the persist thread, while the next training step \
         runs on the same 2 cores. *verified read*: every part read through \
         `ckpt_core::read_part` (manifest lookup, size and XXH3 check) without decoding; restore \
         minus verified read is Burn decoding the burnpack records and loading them into the \
         model and optimizer.\n"
    );
}
