//! A rank that dies in the middle of a sharded save: every other rank fails within the
//! collective timeout (no hang), nothing is published for that step, `latest` stays valid, and
//! resuming reproduces the uninterrupted run. Its own test binary: failpoints are global.

mod common;

use std::time::{Duration, Instant};

use ckpt_burn::{MODEL_FILE, OPTIM_FILE, TRAINER_FILE};
use ckpt_demo::zero::run_threads;
use ckpt_zero::ShardFormat;
use ckpt_zero::checkpoint::FP_BEFORE_GATHER;

#[test]
fn a_rank_dying_mid_gather_fails_every_rank_and_publishes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    run_threads(
        &common::small(&base, 1, 12, Duration::from_secs(30)),
        &mut |_| {},
    )
    .unwrap();

    for format in [ShardFormat::Consolidated, ShardFormat::PerRank] {
        let root = tmp.path().join(format.to_string());
        let timeout = Duration::from_secs(3);
        let mut c = common::small(&root, 4, 12, timeout);
        c.shard_format = format;
        // Step 4's save passes on all 4 ranks; at step 8 the first rank to get there dies.
        fail::cfg(FP_BEFORE_GATHER, "4*off->1*return").unwrap();
        let t0 = Instant::now();
        let err = run_threads(&c, &mut |_| {}).unwrap_err();
        let took = t0.elapsed();
        fail::remove(FP_BEFORE_GATHER);
        eprintln!("{format}: failed after {took:?}: {err}");
        assert!(
            took < timeout * 3 + Duration::from_secs(10),
            "{format}: took {took:?}"
        );
        let ckpts = ckpt_core::verify_root(&root).unwrap();
        let steps: Vec<u64> = ckpts.iter().map(|c| c.step).collect();
        assert_eq!(steps, vec![4], "{format}: only step 4 may be published");
        assert_eq!(
            ckpt_core::read_latest(&root).unwrap().as_deref(),
            Some("step-00000004")
        );

        let mut c = common::small(&root, 4, 12, Duration::from_secs(30));
        c.shard_format = format;
        c.demo.resume = true;
        let report = run_threads(&c, &mut |_| {}).unwrap();
        assert_eq!(report.start_step, 4);
        let leftovers: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let a = base.join("step-00000012");
        let b = root.join("step-00000012");
        for f in [MODEL_FILE, TRAINER_FILE] {
            assert_eq!(
                std::fs::read(a.join(f)).unwrap(),
                std::fs::read(b.join(f)).unwrap(),
                "{f}"
            );
        }
        assert_eq!(
            std::fs::read(a.join(OPTIM_FILE)).unwrap(),
            ckpt_zero::shards::read_full_optimizer(&b).unwrap()
        );
    }
}
