//! The power-loss test can fail: for each durability step the protocol relies on
//! (`ckpt_core::failpoints::omit::ALL`), skip it through its failpoint and run the same
//! exploration as `power_loss.rs`; every omission must produce failures. One test, so that the
//! process-global failpoint configuration is never shared between tests. Listed with the check
//! that catches each in docs/reliability.md ("Power loss").

mod power_loss_support;

use ckpt_core::failpoints::omit;
use power_loss_support::{explore, per_point, report};

#[test]
fn removing_any_durability_step_is_caught() {
    let mut missed = Vec::new();
    for name in omit::ALL {
        fail::cfg(*name, "return").unwrap();
        let e = explore(per_point(16));
        fail::remove(*name);
        report(name, &e);
        if e.failures.is_empty() {
            missed.push(*name);
        }
    }
    assert!(
        missed.is_empty(),
        "omissions the power-loss test did not catch: {missed:?}"
    );
}
