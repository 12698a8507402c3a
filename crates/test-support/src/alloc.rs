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

/// A global allocator that counts the bytes allocated and not yet freed, and the most there
/// were at once since [`Counting::reset_peak`]: what a piece of code needs in memory at its
/// peak, counted by size, not by the pages the kernel has handed out (a zeroed block counts
/// whole at once, although its pages arrive as they are touched).
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: test_support::alloc::Counting = test_support::alloc::Counting::new();
/// ```
#[derive(Debug)]
pub struct Counting {
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl Counting {
    /// A counter at zero.
    pub const fn new() -> Self {
        Self {
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes allocated and not yet freed.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The most bytes allocated at once since the last [`Counting::reset_peak`].
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak from what is allocated now.
    pub fn reset_peak(&self) {
        self.peak.store(self.live(), Ordering::Relaxed);
    }

    fn grew(&self, by: usize) {
        let now = self.live.fetch_add(by, Ordering::Relaxed) + by;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn shrank(&self, by: usize) {
        self.live.fetch_sub(by, Ordering::Relaxed);
    }
}

impl Default for Counting {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same layout contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same layout contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the new block arriving before the old one leaves, as a moving
            // reallocation does.
            self.grew(new_size);
            self.shrank(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        self.shrank(layout.size());
    }
}
