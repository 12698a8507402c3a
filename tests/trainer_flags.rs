//! The example trainer's command line: a flag given twice takes the last value (so wrapper
//! scripts can append overrides), as most Unix tools do.

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
