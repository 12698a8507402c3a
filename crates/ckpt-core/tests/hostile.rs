//! Hostile input for ckpt-core's readers: `manifest.json` (the parser, checkpoint verification,
//! `read_part`, listing and start-up recovery) and `latest`.
//!
//! Mutations (proptest): random byte flips, truncations, appended garbage, version skew (a
//! newer format number), reordered fields, hostile values such as a size of 2^60 or deep
//! nesting. Mutations that keep the self-checksum valid ("re-sealed") reach the JSON decoder
//! and the checks behind it. Every case must give an error naming the file (or, where the
//! mutation keeps the manifest meaningful, parse to it), and never panic, hang or allocate
//! without bound: a global allocator records the largest single allocation and refuses any
//! over 256 MiB (which aborts the test binary).

use std::path::{Path, PathBuf};

use ckpt_core::{
    Engine, EngineConfig, Manifest, Snapshot,
    layout::{FORMAT_VERSION, LATEST_FILE, MANIFEST_FILE},
    list_checkpoints, read_latest, read_part, recover, verify_checkpoint, verify_root,
};
use proptest::prelude::*;
use test_support::alloc::{REFUSE_OVER, Watchful};

#[global_allocator]
static ALLOC: Watchful = Watchful::new(REFUSE_OVER);

/// What any reader here may allocate at once (the checksum buffer is 1 MiB).
const BOUND: usize = 16 << 20;

fn assert_bounded_allocations() {
    ALLOC.assert_bounded(BOUND);
}

const SELF_KEY: &str = "\"manifest_xxh3\": \"";

/// Recomputes the self-checksum of manifest text whose body (everything before the
/// `manifest_xxh3` field) was changed, so the mutation reaches the JSON decoder.
fn reseal(body: &str) -> Vec<u8> {
    let mut out = body.trim_end().to_string();
    out.push_str(",\n  ");
    out.push_str(SELF_KEY);
    let digest = xxhash_rust::xxh3::xxh3_64(out.as_bytes());
    out.push_str(&format!("{digest:016x}\"\n}}\n"));
    out.into_bytes()
}

/// The body of sealed manifest bytes: the text before `,\n  "manifest_xxh3"`.
fn body_of(bytes: &[u8]) -> String {
    let text = std::str::from_utf8(bytes).unwrap();
    let at = text.rfind(SELF_KEY).unwrap();
    text[..at].trim_end().trim_end_matches(',').to_string()
}

/// A real checkpoint (two parts) published by the engine; returns (root, dir, manifest bytes).
fn fixture() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let (mut engine, _) = Engine::open(EngineConfig::new(&root)).unwrap();
    engine
        .submit(
            Snapshot::new(12)
                .with_epoch(3)
                .with_bytes("model.bpk", (0..4096u32).map(|i| i as u8).collect())
                .with_bytes("trainer.bin", b"CKTS\x01\0\0\0state".to_vec())
                .with_meta("note", "fixture"),
        )
        .unwrap();
    engine.finish().unwrap();
    let dir = root.join("step-00000012");
    let bytes = std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
    (tmp, dir, bytes)
}

/// Writes `manifest` into a copy of checkpoint `dir` and runs every reader on it. Returns the
/// parse result; all readers must fail naming the manifest, or all must accept it.
fn readers_on(dir: &Path, manifest: &[u8], case: &Path) -> Result<Manifest, String> {
    let root = case.join("case");
    let copy = root.join("step-00000012");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    std::fs::write(copy.join(MANIFEST_FILE), manifest).unwrap();
    std::fs::write(root.join(LATEST_FILE), "step-00000012\n").unwrap();
    let mpath = copy.join(MANIFEST_FILE);
    let named = |e: &ckpt_core::Error| e.to_string().contains(&mpath.display().to_string());

    let parsed = Manifest::from_bytes(manifest, &mpath);
    if let Err(e) = &parsed {
        assert!(named(e), "error does not name the manifest: {e}");
    }
    let verified = verify_checkpoint(&copy);
    let part = read_part(&copy, "model.bpk");
    let listed = list_checkpoints(&root, true).unwrap();
    assert_eq!(listed.len(), 1);
    match &parsed {
        Err(_) => {
            let e = verified
                .as_ref()
                .expect_err("verify accepted a bad manifest");
            assert!(named(e), "{e}");
            assert!(part.is_err());
            assert!(verify_root(&root).is_err());
            // Recovery moves it aside and leaves `latest` consistent.
            let report = recover(&root).unwrap();
            assert!(report.latest.is_none());
            assert_eq!(read_latest(&root).unwrap(), None);
            verify_root(&root).unwrap();
        }
        Ok(m) => {
            // Accepted by the parser: verification checks every listed file against disk,
            // so it either passes or names a file inside the checkpoint.
            if let Err(e) = &verified {
                assert!(e.to_string().contains(&copy.display().to_string()), "{e}");
            }
            let _ = m;
        }
    }
    assert_bounded_allocations();
    parsed.map_err(|e| e.to_string())
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
    fn flipped_bytes_are_refused_naming_the_manifest(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6)
    ) {
        let (tmp, dir, bytes) = fixture();
        let mut b = bytes.clone();
        for (i, x) in &flips {
            let i = i.index(b.len());
            b[i] ^= x;
        }
        prop_assume!(b != bytes);
        prop_assert!(readers_on(&dir, &b, tmp.path()).is_err());
    }

    #[test]
    fn truncations_are_refused_naming_the_manifest(cut in any::<prop::sample::Index>()) {
        let (tmp, dir, bytes) = fixture();
        let n = cut.index(bytes.len());
        prop_assert!(readers_on(&dir, &bytes[..n], tmp.path()).is_err());
    }

    #[test]
    fn appended_garbage_is_refused_naming_the_manifest(
        extra in proptest::collection::vec(any::<u8>(), 1..64)
    ) {
        let (tmp, dir, bytes) = fixture();
        let mut b = bytes.clone();
        b.extend_from_slice(&extra);
        prop_assert!(readers_on(&dir, &b, tmp.path()).is_err());
    }

    #[test]
    fn a_newer_format_version_is_refused(v in (FORMAT_VERSION + 1)..=u32::MAX) {
        let (tmp, dir, bytes) = fixture();
        let mut m = Manifest::from_bytes(&bytes, Path::new("m")).unwrap();
        m.format_version = v;
        let e = readers_on(&dir, &m.to_bytes(), tmp.path()).unwrap_err();
        prop_assert!(e.contains("newer than this build supports"), "{}", e);
    }

    #[test]
    fn reordered_fields_parse_to_the_same_manifest(seed in any::<u64>()) {
        let (tmp, dir, bytes) = fixture();
        let original = Manifest::from_bytes(&bytes, Path::new("m")).unwrap();
        let body = body_of(&bytes);
        let value: serde_json::Value = serde_json::from_str(&format!("{body}}}")).unwrap();
        let obj = value.as_object().unwrap();
        let mut keys: Vec<&String> = obj.keys().collect();
        // A seeded Fisher-Yates shuffle of the top-level fields.
        let mut s = seed;
        for i in (1..keys.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            keys.swap(i, (s >> 33) as usize % (i + 1));
        }
        let fields: Vec<String> = keys
            .iter()
            .map(|k| format!("  {}: {}", serde_json::to_string(k).unwrap(), obj[*k]))
            .collect();
        let text = format!("{{\n{}", fields.join(",\n"));
        let m = readers_on(&dir, &reseal(&text), tmp.path()).unwrap();
        prop_assert_eq!(m, original);
    }

    #[test]
    fn hostile_values_behind_a_valid_checksum_never_panic(
        field in 0usize..8,
        value in prop_oneof![
            Just("1152921504606846976".to_string()),          // 2^60
            Just("18446744073709551616".to_string()),         // 2^64, out of range
            Just("-1".to_string()),
            Just("1e300".to_string()),
            Just("null".to_string()),
            Just("\"\"".to_string()),
            Just("\"../../etc/passwd\"".to_string()),
            Just(format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000))),
            Just("[{\"name\":\"model.bpk\",\"size\":1152921504606846976,\"xxh3\":\"0\"}]".to_string()),
            Just("{}".to_string()),
            "[a-z0-9\"{}\\[\\]:, ]{0,40}",
        ],
    ) {
        let (tmp, dir, bytes) = fixture();
        let body = body_of(&bytes);
        let mut value_json: serde_json::Value = serde_json::from_str(&format!("{body}}}")).unwrap();
        let keys = ["format_version", "step", "epoch", "world_size", "layout", "created_unix_ms", "files", "meta"];
        let key = keys[field];
        // Splice the raw value text in (it may not be valid JSON at all).
        value_json[key] = serde_json::Value::String("@@HOSTILE@@".into());
        let text = serde_json::to_string_pretty(&value_json).unwrap();
        let text = text.replace("\"@@HOSTILE@@\"", &value);
        let text = text.trim_end().strip_suffix('}').unwrap().to_string();
        let _ = readers_on(&dir, &reseal(&text), tmp.path());
    }

    #[test]
    fn a_file_entry_claiming_2_pow_60_bytes_is_refused_without_allocating_it(
        which in 0usize..2, size in (1u64 << 40)..=u64::MAX
    ) {
        let (tmp, dir, bytes) = fixture();
        let mut m = Manifest::from_bytes(&bytes, Path::new("m")).unwrap();
        m.files[which].size = size;
        let sealed = m.to_bytes();
        readers_on(&dir, &sealed, tmp.path()).unwrap();
        let root = tmp.path().join("case");
        let copy = root.join("step-00000012");
        let e = verify_checkpoint(&copy).unwrap_err();
        let file = copy.join(&m.files[which].name);
        prop_assert!(e.to_string().contains(&file.display().to_string()), "{}", e);
        prop_assert!(read_part(&copy, &m.files[which].name).is_err());
        prop_assert!(recover(&root).unwrap().latest.is_none());
        assert_bounded_allocations();
    }

    #[test]
    fn a_garbage_latest_is_refused_naming_it(garbage in proptest::collection::vec(any::<u8>(), 0..64)) {
        let (tmp, dir, _) = fixture();
        let root = dir.parent().unwrap();
        std::fs::write(root.join(LATEST_FILE), &garbage).unwrap();
        match read_latest(root) {
            Ok(Some(name)) => prop_assert!(ckpt_core::layout::parse_step_dir(&name).is_some()),
            Ok(None) => prop_assert!(false, "latest exists"),
            Err(e) => prop_assert!(e.to_string().contains(LATEST_FILE), "{}", e),
        }
        // Recovery repairs it to the valid checkpoint.
        let report = recover(root).unwrap();
        prop_assert_eq!(report.latest.map(|c| c.step), Some(12));
        let latest = read_latest(root).unwrap();
        prop_assert_eq!(latest.as_deref(), Some("step-00000012"));
        drop(tmp);
    }
}

#[test]
fn file_names_reaching_outside_the_checkpoint_are_refused() {
    let (tmp, dir, bytes) = fixture();
    // A file outside the checkpoint that a hostile manifest could point the readers at.
    let outside = tmp.path().join("outside.bin");
    std::fs::write(&outside, b"secret").unwrap();
    let sum = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(b"secret"));
    for name in [
        "../../outside.bin",
        outside.to_str().unwrap(),
        "a/b",
        "..",
        ".",
        "",
        "x\\y",
        "nul\0byte",
        "model.bpk", // a duplicate entry
    ] {
        let mut m = Manifest::from_bytes(&bytes, Path::new("m")).unwrap();
        m.files.push(ckpt_core::layout::FileEntry {
            name: name.to_string(),
            size: 6,
            xxh3: sum.clone(),
        });
        let e = readers_on(&dir, &m.to_bytes(), tmp.path()).unwrap_err();
        assert!(e.contains("manifest.json"), "{name:?}: {e}");
    }
    assert_bounded_allocations();
}
