//! A global allocator for training programs whose large buffers are mostly fresh memory.
//!
//! Burn's CPU backend allocates a new buffer for most tensor results, and a checkpoint of a
//! Burn state copies it into buffers Burn allocates (`to_record`, `into_bytes`). Large blocks
//! come straight from the kernel (`mmap`), so every one of their 4 KiB pages is faulted in and
//! zeroed at its first write; on a virtual machine each fault is expensive, and a copy into
//! fresh memory runs several times slower than into memory already touched.
//!
//! [`HugePages`] wraps the system allocator and asks the kernel for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`) on every block of at least [`HugePages::MIN_BYTES`] before it is
//! handed out, so such a block faults in 2 MiB at a time: 512 times fewer faults. Nothing
//! else changes: blocks are freed to the system allocator as before, so no freed memory is
//! retained. It takes effect where the kernel's THP mode is `madvise` or `always`
//! ([`thp_mode`] tells which); elsewhere it only costs one failed system call per large block.
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: ckpt_alloc::HugePages = ckpt_alloc::HugePages::new();
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The huge-page size the advice aligns to (x86-64 and arm64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// The system allocator, with transparent huge pages requested for large blocks.
///
/// Advice can be switched off at run time ([`HugePages::set_enabled`]), for example to compare
/// a run without it; it then applies to blocks allocated from that point on.
pub struct HugePages {
    enabled: AtomicBool,
    advised: AtomicU64,
}

impl HugePages {
    /// Blocks of at least this many bytes are advised (two huge pages: a smaller block rarely
    /// spans a whole aligned huge page).
    pub const MIN_BYTES: usize = 2 * HUGE_PAGE;

    /// An allocator that advises large blocks.
    pub const fn new() -> Self {
        Self {
            enabled: AtomicBool::new(true),
            advised: AtomicU64::new(0),
        }
    }

    /// Turns the advice on or off for blocks allocated from now on.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether blocks allocated now are advised.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// How many blocks have been advised since the start, whether or not the kernel honoured
    /// the advice.
    pub fn advised_blocks(&self) -> u64 {
        self.advised.load(Ordering::Relaxed)
    }

    /// Advises the whole huge pages inside `[ptr, ptr + len)`, before anything touches them.
    fn advise(&self, ptr: *mut u8, len: usize) {
        if ptr.is_null() || len < Self::MIN_BYTES || !self.enabled() {
            return;
        }
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
        let end = (ptr as usize + len) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            self.advised.fetch_add(1, Ordering::Relaxed);
            advise_huge(start, end - start);
        }
    }
}

impl Default for HugePages {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(target_os = "linux")]
fn advise_huge(start: usize, len: usize) {
    // SAFETY: `[start, start + len)` lies inside a block the system allocator just handed out
    // and nothing else owns yet; MADV_HUGEPAGE changes how its pages are faulted in, never
    // their contents. A failure (THP compiled out or disabled) leaves the block as it was.
    unsafe {
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_start: usize, _len: usize) {}

// SAFETY: every call is forwarded to `System` with the same arguments; the advice only changes
// how the returned block's pages are faulted in.
unsafe impl GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged (the caller upholds `GlobalAlloc::alloc`'s contract).
        let ptr = unsafe { System.alloc(layout) };
        self.advise(ptr, layout.size());
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        self.advise(ptr, layout.size());
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if new_size > layout.size() {
            self.advise(new, new_size);
        }
        new
    }
}

/// The kernel's transparent-huge-page mode (`always`, `madvise` or `never`), read from
/// `/sys/kernel/mm/transparent_hugepage/enabled`; `None` where that file is missing (THP not
/// built in, or not Linux). [`HugePages`] takes effect under `always` and `madvise`.
pub fn thp_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    // The active mode is the bracketed one: "always [madvise] never".
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_only_large_ones_are_advised() {
        let a = HugePages::new();
        let small = Layout::from_size_align(HugePages::MIN_BYTES - 1, 8).unwrap();
        let large = Layout::from_size_align(3 * HugePages::MIN_BYTES, 64).unwrap();
        unsafe {
            let p = a.alloc(small);
            assert!(!p.is_null());
            a.dealloc(p, small);
            assert_eq!(a.advised_blocks(), 0);

            let p = a.alloc_zeroed(large);
            assert!(!p.is_null());
            let bytes = std::slice::from_raw_parts_mut(p, large.size());
            assert!(
                bytes.iter().all(|b| *b == 0),
                "alloc_zeroed must stay zeroed"
            );
            bytes.fill(7);
            assert_eq!(a.advised_blocks(), 1);

            let bigger = a.realloc(p, large, 2 * large.size());
            assert!(!bigger.is_null());
            let kept = std::slice::from_raw_parts(bigger, large.size());
            assert!(
                kept.iter().all(|b| *b == 7),
                "realloc must keep the contents"
            );
            assert_eq!(a.advised_blocks(), 2);
            a.dealloc(
                bigger,
                Layout::from_size_align(2 * large.size(), 64).unwrap(),
            );
        }
    }

    #[test]
    fn switched_off_it_advises_nothing() {
        let a = HugePages::new();
        a.set_enabled(false);
        let large = Layout::from_size_align(2 * HugePages::MIN_BYTES, 8).unwrap();
        unsafe {
            let p = a.alloc(large);
            a.dealloc(p, large);
        }
        assert_eq!(a.advised_blocks(), 0);
    }

    /// `AnonHugePages` of the mapping that contains `addr`, in KiB, from `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn huge_kib_at(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = head.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(kib) = line.strip_prefix("AnonHugePages:") {
                return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    /// The behaviour that matters: a large block written once is backed by huge pages, where
    /// the kernel offers them on request (with the advice switched off, the same block under
    /// the `madvise` mode gets none: the check fails).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_block_is_backed_by_huge_pages_where_the_kernel_offers_them() {
        let mode = thp_mode();
        if !matches!(mode.as_deref(), Some("madvise" | "always")) {
            eprintln!("THP mode {mode:?}: nothing to check here");
            return;
        }
        let a = HugePages::new();
        let layout = Layout::from_size_align(32 << 20, 4096).unwrap();
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            std::slice::from_raw_parts_mut(p, layout.size()).fill(1);
            let huge = huge_kib_at(p as usize + layout.size() / 2);
            a.dealloc(p, layout);
            assert!(
                huge >= 2048,
                "a 32 MiB block written once has {huge} KiB of huge pages (THP mode {mode:?})"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn thp_mode_is_one_of_the_kernel_modes_where_thp_exists() {
        if let Some(mode) = thp_mode() {
            assert!(
                ["always", "madvise", "never"].contains(&mode.as_str()),
                "{mode}"
            );
        }
    }
}
