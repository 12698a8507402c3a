//! Memory that snapshots in flight hold, and the machine's default budget for it.
//!
//! A snapshot part may declare how many bytes it pins until it is written
//! ([`crate::Snapshot::holding`]): held tensor handles that the next optimizer update would
//! copy instead of writing in place, or a record the persist thread materializes. When the
//! engine takes the snapshot it books those bytes in a ledger and gives each part a guard
//! that returns its share when the part is dropped, that is once it is written (or the save
//! failed). [`crate::Engine::wait_held_at_most`] lets a trainer wait until what is still
//! held fits its budget, instead of writing the whole save while training waits.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Bytes still held by parts not yet written, with a condition variable for waiters.
#[derive(Debug, Default)]
pub(crate) struct HeldLedger {
    bytes: Mutex<u64>,
    released: Condvar,
}

/// A part's share of the ledger, returned when the part is dropped.
#[derive(Debug)]
pub(crate) struct HoldGuard {
    bytes: u64,
    ledger: Arc<HeldLedger>,
}

impl HoldGuard {
    /// Gives back up to `bytes` of this share now: the part has freed them while writing.
    pub(crate) fn release(&mut self, bytes: u64) {
        let k = bytes.min(self.bytes);
        if k == 0 {
            return;
        }
        self.bytes -= k;
        let mut b = self.ledger.bytes.lock().unwrap_or_else(|e| e.into_inner());
        *b = b.saturating_sub(k);
        drop(b);
        self.ledger.released.notify_all();
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.release(self.bytes);
    }
}

impl HeldLedger {
    /// Books `bytes` and returns the guard that gives them back.
    pub(crate) fn hold(self: &Arc<Self>, bytes: u64) -> HoldGuard {
        *self.bytes.lock().unwrap_or_else(|e| e.into_inner()) += bytes;
        HoldGuard {
            bytes,
            ledger: self.clone(),
        }
    }

    /// Bytes held now.
    pub(crate) fn held(&self) -> u64 {
        *self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `slice` for the held bytes to drop to `limit` or below; whether they did.
    pub(crate) fn wait_at_most(&self, limit: u64, slice: Duration) -> bool {
        let b = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let (b, _) = self
            .released
            .wait_timeout_while(b, slice, |b| *b > limit)
            .unwrap_or_else(|e| e.into_inner());
        *b <= limit
    }
}

/// The fraction of the memory available at start that [`auto_snapshot_budget`] allows.
pub const AUTO_BUDGET_FRACTION: f64 = 0.5;

/// The default snapshot memory budget of this machine: half of the memory the kernel reports
/// available now (`MemAvailable` in `/proc/meminfo`), so a save may hold state in the
/// background as long as the machine has room for it, and a larger one makes training wait
/// only until what it still holds fits. `None` where `/proc/meminfo` is unreadable (no
/// limit; callers should say so).
pub fn auto_snapshot_budget() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    mem_available(&text).map(|b| (b as f64 * AUTO_BUDGET_FRACTION) as u64)
}

/// `MemAvailable` in bytes from the text of `/proc/meminfo`.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(n * 1024),
        None => Some(n),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_return_their_bytes_when_dropped() {
        let l = Arc::new(HeldLedger::default());
        let a = l.hold(100);
        let b = l.hold(50);
        assert_eq!(l.held(), 150);
        assert!(!l.wait_at_most(120, Duration::from_millis(1)));
        drop(a);
        assert!(l.wait_at_most(50, Duration::ZERO));
        drop(b);
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn a_waiter_wakes_when_another_thread_releases() {
        let l = Arc::new(HeldLedger::default());
        let g = l.hold(10);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(g);
        });
        assert!(l.wait_at_most(0, Duration::from_secs(10)));
        t.join().unwrap();
    }

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2000 kB\n";
        assert_eq!(mem_available(text), Some(2000 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: x kB\n"), None);
    }
}
