//! Panics a thread turns into errors: a panic inside [`catch`] is an `Err` naming what it said,
//! and the MPI abort-on-panic hook leaves it alone (the job goes on).

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    static CATCHING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`; a panic inside it is `Err(what it said)` instead of unwinding further.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let outer = CATCHING.with(|c| c.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(outer));
    r.map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned())
    })
}

/// Whether a panic on this thread now would be caught by [`catch`].
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn catching() -> bool {
    CATCHING.with(Cell::get)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_inside_is_an_error_with_its_message() {
        assert_eq!(super::catch(|| 7), Ok(7));
        let r: Result<(), String> = super::catch(|| panic!("boom at {}", 5));
        assert_eq!(r, Err("boom at 5".to_owned()));
        assert!(!super::catching(), "the flag is reset after a panic");
    }
}
