//! Power loss during an explicit rewind ([`Engine::rewind`]), simulated on a [`SimDisk`]: a
//! run saves steps 1-4, resumes from step 2 and rewinds (the abandoned timeline's steps 3 and 4
//! move aside), then saves new steps 3 and 4. A power cut after every storage operation, each
//! explored as several disks that keep different subsets of the unsynced state, must leave a
//! root that
//!
//! 1. before recovery: `latest`, when present, names a checkpoint that fully verifies;
//! 2. recovers (`Engine::open`);
//! 3. never mixes timelines: once the rewind was acknowledged, every visible step after 2 holds
//!    the new timeline's bytes and the recovered checkpoint is at least the newest acknowledged
//!    save; before, recovery resumes from the old step 4 intact or from step 2 with nothing
//!    newer visible (a rewind either did not start or is completed, never half done);
//! 4. verifies as a whole after recovery.
//!
//! `CKPT_POWER_LOSS_IMAGES` raises the number of disks per cut (default 16).

use std::{collections::BTreeMap, path::Path, sync::Arc};

use ckpt_core::{Engine, EngineConfig, Retention, Snapshot, layout::checkpoint_dir_name};
use test_support::simdisk::SimDisk;

const ROOT: &str = "/ckpt";

type Parts = BTreeMap<String, Vec<u8>>;

fn parts(step: u64, timeline: u8) -> Parts {
    [("model.bin", 1100usize), ("trainer.bin", 40)]
        .into_iter()
        .map(|(n, len)| {
            let salt = step * 31 + timeline as u64 * 1009 + n.len() as u64;
            let bytes = (0..len)
                .map(|i| (salt.wrapping_add(i as u64 * 7) % 251) as u8)
                .collect();
            (n.to_string(), bytes)
        })
        .collect()
}

fn config(disk: &SimDisk) -> EngineConfig {
    EngineConfig::new(ROOT)
        .storage(Arc::new(disk.clone()))
        .retention(Retention::keep_last(10))
        .persist_nice(None)
}

fn save(engine: &mut Engine, step: u64, timeline: u8) {
    let snap = parts(step, timeline)
        .into_iter()
        .fold(Snapshot::new(step), |s, (n, b)| s.with_bytes(n, b));
    engine.submit(snap).expect("submit");
    engine.wait_idle().expect("published");
}

/// What the workload acknowledged, as storage-op counts: the rewind, and the new timeline's
/// saves.
struct Acks {
    rewind: u64,
    new_saves: Vec<(u64, u64)>,
}

fn workload(disk: &SimDisk) -> Acks {
    let (mut engine, _) = Engine::open(config(disk)).expect("open");
    for step in 1..=4 {
        save(&mut engine, step, 0);
    }
    engine.finish().expect("finish");
    // The resumed run goes back to step 2: only the rewind and what follows is explored.
    disk.record();
    let (mut engine, rec) = Engine::open(config(disk)).expect("reopen");
    assert_eq!(rec.latest.map(|c| c.step), Some(4));
    let moved = engine.rewind(Some(2)).expect("rewind");
    assert_eq!(moved.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [4, 3]);
    let rewind = disk.ops();
    let mut new_saves = Vec::new();
    for step in [3, 4] {
        save(&mut engine, step, 1);
        new_saves.push((disk.ops(), step));
    }
    engine.finish().expect("finish");
    Acks { rewind, new_saves }
}

fn parts_of(disk: &SimDisk, step: u64) -> Result<Parts, String> {
    let dir = Path::new(ROOT).join(checkpoint_dir_name(step));
    let m = ckpt_core::read_manifest(ckpt_core::StoragePath::new(disk, &dir))
        .map_err(|e| e.to_string())?;
    m.files
        .iter()
        .map(|f| {
            ckpt_core::read_part(ckpt_core::StoragePath::new(disk, &dir), &f.name)
                .map(|b| (f.name.clone(), b))
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn check(disk: &SimDisk, acks: &Acks, after_op: u64) -> Result<(), String> {
    let root = Path::new(ROOT);
    // 1. The raw pointer.
    if let Some(name) = ckpt_core::read_latest(ckpt_core::StoragePath::new(disk, root))
        .map_err(|e| format!("1. {e}"))?
    {
        ckpt_core::verify_checkpoint(ckpt_core::StoragePath::new(disk, &root.join(&name)))
            .map_err(|e| format!("1. latest names {name}, which does not verify: {e}"))?;
    }
    // 2. Recovery.
    let (engine, rec) = Engine::open(config(disk)).map_err(|e| format!("2. recovery: {e}"))?;
    let got = rec.latest.map(|c| c.step).ok_or("2. nothing recovered")?;
    let visible: Vec<u64> =
        ckpt_core::list_checkpoints(ckpt_core::StoragePath::new(disk, root), false)
            .map_err(|e| format!("2. listing: {e}"))?
            .iter()
            .map(|c| c.step)
            .collect();
    // 3. One timeline.
    if after_op >= acks.rewind {
        for &s in visible.iter().filter(|&&s| s > 2) {
            if parts_of(disk, s)? != parts(s, 1) {
                return Err(format!(
                    "3. step {s} is the abandoned timeline's after the rewind"
                ));
            }
        }
        let acked = acks
            .new_saves
            .iter()
            .filter(|(at, _)| *at <= after_op)
            .map(|(_, s)| *s)
            .max()
            .unwrap_or(2);
        if got < acked {
            return Err(format!(
                "3. recovered step {got}, older than acked step {acked}"
            ));
        }
    } else {
        let ok = match got {
            4 => visible == [1, 2, 3, 4] && parts_of(disk, 4)? == parts(4, 0),
            2 => visible == [1, 2],
            _ => false,
        };
        if !ok {
            return Err(format!(
                "3. a half-done rewind: recovered step {got}, visible {visible:?}"
            ));
        }
    }
    if parts_of(disk, 2)? != parts(2, 0) {
        return Err("3. step 2 changed".into());
    }
    // 4. Nothing torn visible.
    ckpt_core::verify_root(ckpt_core::StoragePath::new(disk, root))
        .map_err(|e| format!("4. {e}"))?;
    engine.finish().map_err(|e| format!("4. finish: {e}"))?;
    Ok(())
}

#[test]
fn a_power_cut_anywhere_in_a_rewind_never_mixes_timelines() {
    let per_point = std::env::var("CKPT_POWER_LOSS_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let disk = SimDisk::new();
    let acks = workload(&disk);
    let points = disk.take_points();
    let (mut states, mut failures) = (0, Vec::new());
    for point in &points {
        for (label, image) in point.images(per_point, 0x2E41) {
            states += 1;
            if let Err(what) = check(&image, &acks, point.after_op) {
                failures.push(format!(
                    "cut after op {} ({}), {label}: {what}",
                    point.after_op, point.op
                ));
            }
        }
    }
    println!(
        "rewind power loss: {} crash points (rewind acknowledged after op {}), {states} crash \
         states, {} failures",
        points.len(),
        acks.rewind,
        failures.len()
    );
    assert!(states >= 100, "explored only {states} crash states");
    assert!(
        failures.is_empty(),
        "{} of {states} crash states failed; first: {:?}",
        failures.len(),
        failures.first()
    );
}
