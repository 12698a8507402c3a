//! The power-loss explorer shared by `power_loss.rs` (0 failures expected) and
//! `power_loss_mutations.rs` (each omitted durability step must be caught).
//!
//! It runs one workload on a [`SimDisk`] that records a crash point after every storage
//! operation: saves with retention, a save whose producer fails, a resume, a replaced step
//! (`with_replace`), a ZeRO-style save of per-rank files adopted into one checkpoint, and more
//! saves. For every crash point it builds several disks a power cut there may leave
//! ([`CrashPoint::images`]) and checks each:
//!
//! 1. before recovery, `latest`, when present, names a checkpoint that fully verifies, and one
//!    at least as new as the newest save the engine had acknowledged;
//! 2. [`Engine::open`] (recovery) succeeds, and the checkpoint it resumes from is at least as
//!    new as the newest acknowledged save and was really saved;
//! 3. every part of it is byte-identical to what was saved at that step (for a replaced step:
//!    the acknowledged version or a newer one, never an older or a mix);
//! 4. after recovery the whole root verifies (no torn checkpoint is left visible);
//! 5. the recovered root takes a new save.

#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    sync::Arc,
};

use ckpt_core::{
    Engine, EngineConfig, Retention, Snapshot, Storage, layout::checkpoint_dir_name,
    snapshot::PartProducer,
};
use test_support::simdisk::{CrashPoint, SimDisk};

/// The checkpoint root on the simulated disk.
pub(crate) const ROOT: &str = "/ckpt";

/// One version of a step's parts, as saved.
type Parts = BTreeMap<String, Vec<u8>>;

/// What the workload saved and when the engine acknowledged it.
#[derive(Debug, Default)]
pub(crate) struct Expectations {
    /// Every version submitted for each step, in order.
    versions: BTreeMap<u64, Vec<Parts>>,
    /// (storage ops completed when acknowledged, step, version index).
    acks: Vec<(u64, u64, usize)>,
}

impl Expectations {
    fn submitted(&mut self, step: u64, parts: Parts) -> usize {
        let v = self.versions.entry(step).or_default();
        v.push(parts);
        v.len() - 1
    }

    /// The newest save acknowledged once `ops` storage operations had completed.
    fn acked_at(&self, ops: u64) -> Option<(u64, usize)> {
        self.acks
            .iter()
            .filter(|(at, _, _)| *at <= ops)
            .map(|(_, s, v)| (*s, *v))
            .max()
    }

    /// The versions of `step` a crash after `ops` operations may leave: the acknowledged one
    /// (if any) and everything submitted after it.
    fn allowed(&self, step: u64, ops: u64) -> &[Parts] {
        let Some(all) = self.versions.get(&step) else {
            return &[];
        };
        let from = self
            .acks
            .iter()
            .filter(|(at, s, _)| *at <= ops && *s == step)
            .map(|(_, _, v)| *v)
            .max()
            .unwrap_or(0);
        &all[from..]
    }
}

fn payload(step: u64, version: u8, name: &str, len: usize) -> Vec<u8> {
    let salt = name.bytes().fold(step * 31 + version as u64, |a, b| {
        a.wrapping_mul(131).wrapping_add(b as u64)
    });
    (0..len)
        .map(|i| (salt.wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

fn parts(step: u64, version: u8) -> Parts {
    // Sizes around the simulator's 512-byte torn block, so a torn tail stays within a part.
    [
        ("model.bin", 3000),
        ("optim.bin", 1500),
        ("trainer.bin", 40),
    ]
    .into_iter()
    .map(|(n, len)| (n.to_string(), payload(step, version, n, len)))
    .collect()
}

fn snapshot(step: u64, p: &Parts) -> Snapshot {
    p.iter().fold(Snapshot::new(step), |s, (n, b)| {
        s.with_bytes(n.clone(), b.clone())
    })
}

/// A producer that writes some bytes and then fails, as an encoder might.
struct FailingProducer;

impl PartProducer for FailingProducer {
    fn write_into(
        self: Box<Self>,
        w: &mut dyn Write,
    ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
        w.write_all(&[7u8; 900])?;
        Err("the encoder failed halfway".into())
    }
}

fn config(disk: &SimDisk) -> EngineConfig {
    EngineConfig::new(ROOT)
        .storage(Arc::new(disk.clone()))
        .retention(Retention::keep_last(2))
        .persist_nice(None)
}

fn save(engine: &mut Engine, disk: &SimDisk, exp: &mut Expectations, snap: Snapshot, p: Parts) {
    let step = snap.step;
    let v = exp.submitted(step, p);
    engine.submit(snap).expect("submit");
    engine.wait_idle().expect("save is published");
    exp.acks.push((disk.ops(), step, v));
}

/// Runs the workload on `disk` (recording crash points) and returns what it saved.
pub(crate) fn workload(disk: &SimDisk) -> Expectations {
    let mut exp = Expectations::default();
    disk.record();
    let (mut engine, rec) = Engine::open(config(disk)).expect("open an empty root");
    assert!(rec.latest.is_none());
    for step in 1..=4 {
        let p = parts(step, 0);
        save(&mut engine, disk, &mut exp, snapshot(step, &p), p);
    }
    // A save whose encoder fails: nothing may be published, and its data is removed.
    engine
        .submit(Snapshot::new(5).with_producer("model.bin", FailingProducer))
        .expect("submit");
    assert!(
        engine.wait_idle().is_err(),
        "the failing save reports its error"
    );
    engine.finish().expect("finish");

    // Resume: recovery, then read the newest checkpoint back.
    let (mut engine, rec) = Engine::open(config(disk)).expect("reopen");
    let latest = rec.latest.expect("a checkpoint to resume from");
    assert_eq!(latest.step, 4);
    for (name, bytes) in &parts(4, 0) {
        let got = ckpt_core::read_part(ckpt_core::StoragePath::new(disk, &latest.path), name)
            .expect("read back");
        assert_eq!(&got, bytes, "resumed {name}");
    }
    // Replace the newest step in place (latest does not move).
    let p = parts(4, 1);
    save(
        &mut engine,
        disk,
        &mut exp,
        snapshot(4, &p).with_replace(true),
        p,
    );
    // A ZeRO-style save: two ranks write their shards durably, the publisher adopts them.
    let mut p = parts(6, 0);
    let mut snap = Snapshot::new(6).with_bytes("model.bin", p["model.bin"].clone());
    p.remove("optim.bin");
    p.remove("trainer.bin");
    for rank in 0..2u32 {
        let name = format!("optim-rank{rank}.bin");
        let bytes = payload(6, 0, &name, 1200);
        let path = PathBuf::from(ROOT).join(format!(".tmp-shard-{rank}-6"));
        let durable =
            ckpt_core::write_durable_file(ckpt_core::StoragePath::new(disk, &path), |w| {
                w.write_all(&bytes)
            })
            .expect("shard written");
        snap = snap.with_adopted(name.clone(), durable);
        p.insert(name, bytes);
    }
    save(&mut engine, disk, &mut exp, snap, p);
    for step in [7, 8] {
        let p = parts(step, 0);
        save(&mut engine, disk, &mut exp, snapshot(step, &p), p);
    }
    engine.finish().expect("finish");
    exp
}

/// One failed check: where power was cut, which disk, and what was wrong.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Storage operations completed at the cut.
    pub(crate) after_op: u64,
    /// The last operation before the cut.
    pub(crate) op: String,
    /// Which volatile state survived.
    pub(crate) image: String,
    /// Which check failed, and how.
    pub(crate) what: String,
}

/// The outcome of an exploration.
#[derive(Debug, Default)]
pub(crate) struct Exploration {
    /// Crash points (storage operations) of the workload.
    pub(crate) points: usize,
    /// Distinct disks checked.
    pub(crate) states: usize,
    /// The checks that failed.
    pub(crate) failures: Vec<Failure>,
}

impl Exploration {
    /// How many failures each numbered check (1-5, see the module docs) reported.
    pub(crate) fn by_check(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for f in &self.failures {
            let check = f.what.split('.').next().unwrap_or("?").to_string();
            *m.entry(check).or_insert(0) += 1;
        }
        m
    }
}

/// Runs the workload and checks up to `per_point` disks at every crash point.
pub(crate) fn explore(per_point: usize) -> Exploration {
    let disk = SimDisk::new();
    let exp = workload(&disk);
    let points = disk.take_points();
    let mut out = Exploration {
        points: points.len(),
        ..Default::default()
    };
    for point in &points {
        for (label, image) in point.images(per_point, 0x5EED) {
            out.states += 1;
            if let Err(what) = check(&image, &exp, point) {
                out.failures.push(Failure {
                    after_op: point.after_op,
                    op: point.op.clone(),
                    image: label,
                    what,
                });
            }
        }
    }
    out
}

/// The number of disks to check per crash point: `CKPT_POWER_LOSS_IMAGES` or `default`.
pub(crate) fn per_point(default: usize) -> usize {
    std::env::var("CKPT_POWER_LOSS_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn check(disk: &SimDisk, exp: &Expectations, point: &CrashPoint) -> Result<(), String> {
    let root = Path::new(ROOT);
    let acked = exp.acked_at(point.after_op);
    // 1. The raw pointer, before recovery touches anything.
    if disk.exists(root) {
        match ckpt_core::read_latest(ckpt_core::StoragePath::new(disk, root)) {
            Err(e) => return Err(format!("1. latest is unreadable before recovery: {e}")),
            Ok(None) => {
                if let Some((s, _)) = acked {
                    return Err(format!("1. latest is missing although step {s} was acked"));
                }
            }
            Ok(Some(name)) => {
                if let Err(e) = ckpt_core::verify_checkpoint(ckpt_core::StoragePath::new(
                    disk,
                    &root.join(&name),
                )) {
                    return Err(format!(
                        "1. latest names {name}, which does not verify: {e}"
                    ));
                }
                let step = ckpt_core::layout::parse_step_dir(&name).unwrap_or(0);
                if let Some((s, _)) = acked
                    && step < s
                {
                    return Err(format!("1. latest names {name}, older than acked step {s}"));
                }
            }
        }
    } else if let Some((s, _)) = acked {
        return Err(format!("1. the root is gone although step {s} was acked"));
    }
    // 2. Recovery.
    let (mut engine, rec) =
        Engine::open(config(disk)).map_err(|e| format!("2. recovery failed: {e}"))?;
    let resumed = match (&rec.latest, acked) {
        (None, None) => None,
        (None, Some((s, _))) => return Err(format!("2. nothing recovered; step {s} was acked")),
        (Some(c), Some((s, _))) if c.step < s => {
            return Err(format!(
                "2. recovered step {}, older than acked step {s}",
                c.step
            ));
        }
        (Some(c), _) => Some(c.clone()),
    };
    // 3. The bytes.
    if let Some(c) = &resumed {
        let allowed = exp.allowed(c.step, point.after_op);
        if allowed.is_empty() {
            return Err(format!(
                "3. recovered step {}, which was never saved",
                c.step
            ));
        }
        let m = ckpt_core::read_manifest(ckpt_core::StoragePath::new(disk, &c.path))
            .map_err(|e| format!("3. {e}"))?;
        let mut got = Parts::new();
        for f in &m.files {
            let b = ckpt_core::read_part(ckpt_core::StoragePath::new(disk, &c.path), &f.name)
                .map_err(|e| format!("3. reading {}: {e}", f.name))?;
            got.insert(f.name.clone(), b);
        }
        if !allowed.contains(&got) {
            return Err(format!(
                "3. step {}'s parts match none of its {} allowed versions",
                c.step,
                allowed.len()
            ));
        }
    }
    // 4. Nothing torn left visible.
    if let Err(e) = ckpt_core::verify_root(ckpt_core::StoragePath::new(disk, root)) {
        return Err(format!("4. root does not verify after recovery: {e}"));
    }
    // 5. The root takes a new save.
    let next = resumed.map(|c| c.step).unwrap_or(0) + 100;
    let p = parts(next, 0);
    engine
        .submit(snapshot(next, &p))
        .and_then(|_| engine.wait_idle())
        .map_err(|e| format!("5. a save after recovery failed: {e}"))?;
    engine
        .finish()
        .map_err(|e| format!("5. finish after recovery failed: {e}"))?;
    let dir = root.join(checkpoint_dir_name(next));
    ckpt_core::verify_checkpoint(ckpt_core::StoragePath::new(disk, &dir))
        .map_err(|e| format!("5. the save after recovery does not verify: {e}"))?;
    Ok(())
}

/// Prints a summary and the first failures.
pub(crate) fn report(name: &str, e: &Exploration) {
    println!(
        "{name}: {} crash points, {} crash states checked, {} failures",
        e.points,
        e.states,
        e.failures.len()
    );
    if !e.failures.is_empty() {
        println!("  failures by check: {:?}", e.by_check());
    }
    for f in e.failures.iter().take(2) {
        println!(
            "  cut after op {} ({}), {}: {}",
            f.after_op, f.op, f.image, f.what
        );
    }
}
