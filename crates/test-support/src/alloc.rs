//! [`Watchful`]: a `GlobalAlloc` wrapper around the system allocator that records the largest
//! single allocation and refuses (returns null for) any over a limit, which aborts the test
//! binary instead of letting a reader allocate without bound.
//!
//! A global allocator must be declared in the final binary, so each test file declares its
//! own:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: test_support::alloc::Watchful =
//!     test_support::alloc::Watchful::new(test_support::alloc::REFUSE_OVER);
//! ```

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
};

/// The limit the hostile-input tests refuse allocations over: 256 MiB.
pub const REFUSE_OVER: usize = 256 << 20;

/// Records the largest allocation; refuses absurd ones.
#[derive(Debug)]
pub struct Watchful {
    largest: AtomicUsize,
    refuse_over: usize,
}

impl Watchful {
    /// A watcher refusing any single allocation over `refuse_over` bytes.
    pub const fn new(refuse_over: usize) -> Self {
        Self {
            largest: AtomicUsize::new(0),
            refuse_over,
        }
    }

    /// The largest single allocation (or reallocation) asked for so far, in bytes.
    pub fn largest(&self) -> usize {
        self.largest.load(Ordering::Relaxed)
    }

    /// `Err("a reader allocated N bytes at once")` if the largest allocation so far is over
    /// `bound` bytes.
    pub fn check_bounded(&self, bound: usize) -> Result<(), String> {
        let largest = self.largest();
        if largest > bound {
            return Err(format!("a reader allocated {largest} bytes at once"));
        }
        Ok(())
    }

    /// Asserts the largest allocation so far is at most `bound` bytes.
    pub fn assert_bounded(&self, bound: usize) {
        let largest = self.largest();
        assert!(
            largest <= bound,
            "a reader allocated {largest} bytes at once"
        );
    }

    /// Records an allocation of `size` bytes; true if it must be refused.
    fn refuses(&self, size: usize) -> bool {
        self.largest.fetch_max(size, Ordering::Relaxed);
        size > self.refuse_over
    }
}

// SAFETY: forwards to the system allocator; refusing (null) is allowed by `GlobalAlloc`.
unsafe impl GlobalAlloc for Watchful {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.refuses(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same layout contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if self.refuses(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same layout contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if self.refuses(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}
