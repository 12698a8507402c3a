//! Power loss, simulated: a cut after every storage operation of a workload of saves,
//! retention, a failed save, a resume, a replaced step and a ZeRO-style adopted save, each cut
//! explored as several disks that keep different subsets of the unsynced state (see
//! `test_support::simdisk` for the model). Every disk must recover to a checkpoint at least as
//! new as the newest acknowledged save, byte-identical to what was saved, with nothing torn
//! visible. `CKPT_POWER_LOSS_IMAGES` raises the number of disks per cut (default 16).

mod power_loss_support;

use power_loss_support::{explore, per_point, report};

#[test]
fn every_power_cut_recovers_the_newest_acknowledged_checkpoint() {
    let e = explore(per_point(16));
    report("power loss", &e);
    assert!(
        e.states >= 1000,
        "explored only {} crash states; the workload or the simulator shrank",
        e.states
    );
    assert!(
        e.failures.is_empty(),
        "{} of {} crash states failed; first: {:?}",
        e.failures.len(),
        e.states,
        e.failures.first()
    );
}
