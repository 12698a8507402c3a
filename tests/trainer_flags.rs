//! The example trainer's command line: a flag given twice takes the last value (so wrapper
//! scripts can append overrides), as most Unix tools do; its defaults are the library's.

mod common;

use common::*;

#[test]
fn child_entry() {
    common::child_entry();
}

#[test]
fn a_flag_given_twice_takes_the_last_value() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let report = tmp.path().join("report.json");
    trainer(&dir)
        .steps(4)
        .save_every(2)
        .arg("--report", report.display())
        .steps(6)
        .save_every(3)
        .run_ok();
    let r = read_report(&report);
    assert_eq!(r["final_step"], 6, "{r}");
    assert_eq!(assert_published_valid(&dir), [3, 6]);
}

#[test]
fn retention_keeps_the_newest_three_by_default_as_the_library_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("default");
    trainer(&dir)
        .without("--keep-all")
        .steps(12)
        .save_every(2)
        .run_ok();
    assert_eq!(assert_published_valid(&dir), [8, 10, 12]);

    // The later of --keep-last and --keep-all wins.
    let dir = tmp.path().join("all");
    trainer(&dir)
        .without("--keep-all")
        .arg("--keep-last", 2)
        .flag("--keep-all")
        .steps(8)
        .save_every(2)
        .run_ok();
    assert_eq!(assert_published_valid(&dir), [2, 4, 6, 8]);
}

#[test]
fn a_fresh_run_in_a_used_dir_is_refused_before_training_and_fresh_starts_over() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    trainer(&dir).steps(12).save_every(4).run_ok();
    let m12 = std::fs::read(step_dir(&dir, 12).join(FILES[0])).unwrap();

    // Another run (another seed) without --resume: refused before its first step.
    let refused = trainer(&dir).steps(6).save_every(2).arg("--seed", 99).run();
    assert_eq!(refused.status.code(), Some(1), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("already holds checkpoints (newest step-00000012)")
            && refused.stderr.contains("--resume")
            && refused.stderr.contains("--fresh"),
        "{}",
        refused.stderr
    );
    assert!(
        !refused.stderr.contains("step 1/"),
        "refused before training: {}",
        refused.stderr
    );
    assert_eq!(assert_published_valid(&dir), [4, 8, 12]);
    assert_eq!(
        std::fs::read(step_dir(&dir, 12).join(FILES[0])).unwrap(),
        m12
    );

    // --fresh starts over: the old run is moved aside, `latest` names the new run's newest,
    // and --resume continues the new run.
    let fresh = trainer(&dir)
        .steps(6)
        .save_every(2)
        .arg("--seed", 99)
        .flag("--fresh")
        .run_ok();
    assert!(fresh.stderr.contains("moved aside"), "{}", fresh.stderr);
    assert_eq!(assert_published_valid(&dir), [2, 4, 6]);
    assert_eq!(
        burn_ckpt::ckpt_core::read_latest(&dir).unwrap().as_deref(),
        Some("step-00000006")
    );
    let aside = test_support::fs::rewound_entries(&dir).len();
    assert_eq!(aside, 3);
    let resumed = trainer(&dir)
        .steps(8)
        .save_every(2)
        .arg("--seed", 99)
        .flag("--resume")
        .run_ok();
    assert!(
        resumed.stderr.contains("resumed from step 6"),
        "{}",
        resumed.stderr
    );
}
