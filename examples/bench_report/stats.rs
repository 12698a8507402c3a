//! Small statistics and number-formatting helpers shared by every section.

use std::time::Duration;

use burn_ckpt::ckpt_core::SaveRoute;

/// A duration in milliseconds.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median; NaN for no samples.
pub(crate) fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The smallest and the largest sample.
pub(crate) fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

/// `median [min-max]` with a precision suited to the magnitude.
pub(crate) fn med_range(v: &[f64]) -> String {
    let (lo, hi) = min_max(v);
    format!("{} [{}-{}]", num(median(v)), num(lo), num(hi))
}

/// A number with a precision suited to its magnitude; `n/a` if not finite.
pub(crate) fn num(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x == 0.0 {
        "0".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else if x.abs() >= 0.01 {
        format!("{x:.3}")
    } else {
        format!("{x:.4}")
    }
}

/// Bytes in MB (10^6).
pub(crate) fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

/// The name of a save route for the tables.
pub(crate) fn route_name(r: Option<SaveRoute>) -> &'static str {
    match r {
        Some(SaveRoute::Background) => "background",
        Some(SaveRoute::Blocking) => "blocking",
        Some(SaveRoute::Throttled) => "throttled",
        None => "-",
    }
}

/// The verdict column of the targets table.
pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**missed**" }
}
