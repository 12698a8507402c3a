//! [`assign_param_ids`] draws a freshly built model's weights at once, from the backend RNG as
//! the caller seeded it. Burn 0.22 initializes parameters lazily, at their first use; the
//! backend RNG is process-global, so a model first used after another thread re-seeded it or
//! drew from it would start from other weights, and two runs meant to be identical would
//! differ (a flaky exact-resume test in `tests/learner_signals.rs` was this).
//!
//! One test in this binary: it re-seeds the process-global backend RNG.

use burn::tensor::{Device, Distribution, Tensor};
use ckpt_burn::{assign_param_ids, encode_model};
use test_support::tiny::Tiny;

#[test]
fn assign_param_ids_draws_lazy_weights_under_the_callers_seed() {
    let device = Device::flex();
    let first = encode_model(assign_param_ids(Tiny::seeded(&device, 5), 1)).unwrap();

    let model = assign_param_ids(Tiny::seeded(&device, 5), 1);
    // Another user of the RNG between building the model and its first use.
    device.seed(99);
    let _ = Tensor::<1>::random([64], Distribution::Default, &device).into_data();
    let second = encode_model(model).unwrap();

    assert!(
        first == second,
        "the model's weights were drawn at its first use, not when it was built"
    );
}
