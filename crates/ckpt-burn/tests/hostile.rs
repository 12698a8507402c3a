//! Hostile input for the readers behind `ckpt_burn::restore`: the `trainer.bin` decoder and the
//! burnpack record readers of `model.bpk`, `optim.bpk` and `scheduler.bpk`.
//!
//! Mutations (proptest): random byte flips, truncations, appended garbage, version skew (a
//! newer format number), reordered fields, and length fields claiming absurd sizes. Each
//! mutated file is tried two ways:
//! - under the checkpoint's original manifest: restore must fail, naming the file (the
//!   checksum catches every change);
//! - re-published with a manifest that matches it ("re-sealed"), so the decoders themselves
//!   see it: they must never panic, hang or allocate without bound, and every error must name
//!   the file. (A mutation can also decode to other valid values, e.g. a flipped bit inside
//!   tensor data: integrity is the manifest's job, robustness the decoders'.)
//!
//! A global allocator records the largest single allocation and refuses any over 256 MiB
//! (which aborts the test binary).

use std::{
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::{OnceLock, atomic::Ordering},
    time::{Duration, Instant},
};

use burn::optim::AdamWConfig;
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::tensor::Device;
use ckpt_burn::{
    MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE, TRAINER_STATE_VERSION, TrainerState,
};
use ckpt_core::{Engine, EngineConfig, Snapshot};
use ckpt_demo::{self as demo, DemoConfig, Frequency, Mlp};
use proptest::prelude::*;
use test_support::alloc::{REFUSE_OVER, Watchful};

#[global_allocator]
static ALLOC: Watchful = Watchful::new(REFUSE_OVER);

/// The whole checkpoint is a few tens of KiB; no reader may allocate more than this at once.
const BOUND: usize = 32 << 20;

const FILES: [&str; 4] = [MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE];
const HIDDEN: usize = 16;

/// A real checkpoint written by the example trainer: (directory, files' bytes).
fn fixture() -> &'static (PathBuf, Vec<Vec<u8>>) {
    static F: OnceLock<(PathBuf, Vec<Vec<u8>>)> = OnceLock::new();
    F.get_or_init(|| {
        let root = scratch().join("fixture");
        let mut cfg = DemoConfig::new(&root);
        cfg.hidden = HIDDEN;
        cfg.layers = 2;
        cfg.batch_size = 4;
        cfg.dataset_size = 20;
        cfg.steps = 3;
        cfg.frequency = Frequency::EverySteps(3);
        demo::run(&cfg, &mut |_| {}).expect("fixture training");
        let dir = root.join(ckpt_core::layout::checkpoint_dir_name(3));
        let bytes = FILES
            .iter()
            .map(|f| std::fs::read(dir.join(f)).unwrap())
            .collect();
        (dir, bytes)
    })
}

/// A scratch directory on a RAM filesystem where there is one (fsync is free there).
fn scratch() -> &'static Path {
    static S: OnceLock<tempfile::TempDir> = OnceLock::new();
    S.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        if shm.is_dir()
            && let Ok(t) = tempfile::tempdir_in(shm)
        {
            return t;
        }
        tempfile::tempdir().unwrap()
    })
    .path()
}

fn fresh_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let d = scratch().join(format!("{tag}-{}", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Everything restore reads, on checkpoint `dir`: returns the first error's text, or None if
/// every reader accepted the files. Panics are caught and reported as test failures.
fn restore_all(dir: &Path) -> Result<Option<String>, String> {
    let t0 = Instant::now();
    let res = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let device = Device::flex().autodiff();
        let model = Mlp::new(HIDDEN, 2, 0.1, &device);
        let optim = AdamWConfig::new().init();
        let sched = CosineAnnealingLrSchedulerConfig::new(1e-3, 10)
            .init()
            .expect("scheduler config");
        let mut first = None;
        let mut note = |r: Result<(), ckpt_burn::Error>| {
            if let (Err(e), None) = (r, &first) {
                first = Some(e.to_string());
            }
        };
        note(ckpt_burn::load_trainer_state(dir).map(|_| ()));
        note(ckpt_burn::load_model(dir, model.clone()).map(|_| ()));
        note(ckpt_burn::load_optimizer(dir, AdamWConfig::new().init()).map(|_| ()));
        note(ckpt_burn::load_scheduler(dir, sched.clone()).map(|_| ()));
        note(ckpt_burn::restore(dir, model, optim, sched).map(|_| ()));
        first
    }));
    let took = t0.elapsed();
    if took > Duration::from_secs(20) {
        return Err(format!("readers took {took:?}"));
    }
    ALLOC.check_bounded(BOUND)?;
    res.map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("a reader panicked: {msg}")
    })
}

/// The checkpoint with file `which` replaced by `bytes`, under the original manifest.
fn under_original_manifest(which: usize, bytes: &[u8]) -> PathBuf {
    let (good, _) = fixture();
    let d = fresh_dir("orig");
    for e in std::fs::read_dir(good).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    std::fs::write(d.join(FILES[which]), bytes).unwrap();
    d
}

/// The checkpoint with file `which` replaced by `bytes`, published with a matching manifest.
fn resealed(which: usize, bytes: &[u8]) -> PathBuf {
    let (_, files) = fixture();
    let root = fresh_dir("sealed");
    let (mut engine, _) = Engine::open(EngineConfig::new(&root)).unwrap();
    let mut snap = Snapshot::new(3);
    for (i, f) in FILES.iter().enumerate() {
        let b = if i == which {
            bytes.to_vec()
        } else {
            files[i].clone()
        };
        snap = snap.with_bytes(*f, b);
    }
    engine.submit(snap).unwrap();
    engine.finish().unwrap();
    root.join(ckpt_core::layout::checkpoint_dir_name(3))
}

/// Runs both exposures for file `which` mutated to `bytes`.
fn check(which: usize, bytes: &[u8]) -> Result<(), TestCaseError> {
    let (_, files) = fixture();
    let name = FILES[which];
    if bytes != files[which].as_slice() {
        let d = under_original_manifest(which, bytes);
        let err = restore_all(&d).map_err(TestCaseError::fail)?;
        let file = d.join(name).display().to_string();
        match err {
            Some(e) => prop_assert!(e.contains(&file), "error does not name {}: {}", file, e),
            None => prop_assert!(false, "a changed {} restored under the old manifest", name),
        }
        let _ = std::fs::remove_dir_all(&d);
    }
    let d = resealed(which, bytes);
    if let Some(e) = restore_all(&d).map_err(TestCaseError::fail)? {
        // Any of the four files may be named: a valid model with a garbled optimizer names
        // optim.bpk, and so on; it must be a file of this checkpoint.
        prop_assert!(
            FILES
                .iter()
                .any(|f| e.contains(&d.join(f).display().to_string())),
            "error names no file of {}: {}",
            d.display(),
            e
        );
    }
    let _ = std::fs::remove_dir_all(d.parent().unwrap());
    Ok(())
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(Vec<(prop::sample::Index, u8)>),
    /// Flips within the first 1 KiB: the header and the CBOR metadata of a burnpack.
    FlipHead(Vec<(prop::sample::Index, u8)>),
    Truncate(prop::sample::Index),
    Append(Vec<u8>),
    /// Overwrite 4 or 8 bytes at an offset with a little-endian value (length fields).
    Poke(prop::sample::Index, u64, bool),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6)
            .prop_map(Mutation::Flip),
        3 => proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4)
            .prop_map(Mutation::FlipHead),
        2 => any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..256).prop_map(Mutation::Append),
        2 => (
            any::<prop::sample::Index>(),
            prop_oneof![Just(1u64 << 60), Just(u64::MAX), Just(u32::MAX as u64), any::<u64>()],
            any::<bool>()
        ).prop_map(|(i, v, wide)| Mutation::Poke(i, v, wide)),
    ]
}

fn apply(m: &Mutation, orig: &[u8]) -> Vec<u8> {
    let mut b = orig.to_vec();
    match m {
        Mutation::Flip(flips) => {
            for (i, x) in flips {
                let i = i.index(b.len());
                b[i] ^= x;
            }
        }
        Mutation::FlipHead(flips) => {
            for (i, x) in flips {
                let i = i.index(b.len().min(1024));
                b[i] ^= x;
            }
        }
        Mutation::Truncate(i) => b.truncate(i.index(b.len())),
        Mutation::Append(extra) => b.extend_from_slice(extra),
        Mutation::Poke(i, v, wide) => {
            let w = if *wide { 8 } else { 4 };
            let at = i.index(b.len().saturating_sub(w).max(1));
            let bytes = v.to_le_bytes();
            let n = w.min(b.len() - at);
            b[at..at + n].copy_from_slice(&bytes[..n]);
        }
    }
    b
}

/// `PROPTEST_CASES` raises the number of cases for a longer local run.
fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn mutated_model_bpk_never_panics_and_errors_name_the_file(m in mutation()) {
        check(0, &apply(&m, &fixture().1[0]))?;
    }

    #[test]
    fn mutated_optim_bpk_never_panics_and_errors_name_the_file(m in mutation()) {
        check(1, &apply(&m, &fixture().1[1]))?;
    }

    #[test]
    fn mutated_scheduler_bpk_never_panics_and_errors_name_the_file(m in mutation()) {
        check(2, &apply(&m, &fixture().1[2]))?;
    }

    #[test]
    fn mutated_trainer_bin_never_panics_and_errors_name_the_file(m in mutation()) {
        let b = apply(&m, &fixture().1[3]);
        // The decoder alone, too.
        let p = Path::new("some/dir/trainer.bin");
        if let Err(e) = TrainerState::from_bytes(&b, p) {
            prop_assert!(e.to_string().contains("some/dir/trainer.bin"), "{}", e);
        }
        check(3, &b)?;
    }

    #[test]
    fn a_newer_trainer_bin_version_is_refused(v in (TRAINER_STATE_VERSION + 1)..=u32::MAX) {
        let mut b = fixture().1[3].clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let d = resealed(3, &b);
        let e = restore_all(&d).map_err(TestCaseError::fail)?.expect("refused");
        prop_assert!(e.contains("is newer than the supported version"), "{}", e);
        prop_assert!(e.contains(&d.join(TRAINER_FILE).display().to_string()), "{}", e);
    }

    #[test]
    fn reordered_trainer_bin_fields_never_panic(seed in any::<u64>()) {
        // The payload is a sequence of varints (version, step, epoch, cursor, seed): shuffle
        // them, so fields land in each other's places.
        let orig = &fixture().1[3];
        let mut fields: Vec<Vec<u8>> = Vec::new();
        let mut cur = Vec::new();
        let payload = &orig[8..];
        let mut i = 0;
        while i < payload.len() {
            let b = payload[i];
            cur.push(b);
            // bincode varint: < 251 is one byte; 251/252/253 prefix 2/4/8 more bytes.
            let extra = match b { 251 => 2, 252 => 4, 253 => 8, 254 => 16, _ => 0 };
            cur.extend_from_slice(&payload[i + 1..(i + 1 + extra).min(payload.len())]);
            i += 1 + extra;
            fields.push(std::mem::take(&mut cur));
        }
        let mut s = seed;
        for k in (1..fields.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            fields.swap(k, (s >> 33) as usize % (k + 1));
        }
        let mut b = orig[..8].to_vec();
        for f in &fields {
            b.extend_from_slice(f);
        }
        check(3, &b)?;
    }
}

/// Burnpack's header: magic (4), format version (2), metadata size (4), then CBOR metadata.
#[test]
fn burnpack_version_skew_and_absurd_metadata_sizes_are_refused_naming_the_file() {
    for (which, name) in [(0, MODEL_FILE), (1, OPTIM_FILE), (2, SCHEDULER_FILE)] {
        let orig = &fixture().1[which];
        let mut cases = Vec::new();
        // A newer format version.
        for v in [2u16, 0x100, u16::MAX] {
            let mut b = orig.clone();
            b[4..6].copy_from_slice(&v.to_le_bytes());
            cases.push((format!("version {v}"), b));
        }
        // A metadata size claiming up to 4 GiB.
        for size in [u32::MAX, 1 << 31, (orig.len() as u32) * 2] {
            let mut b = orig.clone();
            b[6..10].copy_from_slice(&size.to_le_bytes());
            cases.push((format!("metadata size {size}"), b));
        }
        for (what, b) in cases {
            let d = resealed(which, &b);
            let e = restore_all(&d)
                .unwrap_or_else(|e| panic!("{name} {what}: {e}"))
                .unwrap_or_else(|| panic!("{name} with {what} was accepted"));
            assert!(
                e.contains(&d.join(name).display().to_string()),
                "{name} {what}: {e}"
            );
        }
    }
}
