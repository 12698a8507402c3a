//! A staging-memory pool with a hard byte budget.
//!
//! Buffers are allocated once, pre-faulted (fresh pages cost 5-7x on the copy), and reused
//! across saves. The sum of all buffers the pool holds, leased or free, never exceeds the
//! budget; when a lease does not fit, free buffers are released first, and if leased buffers
//! still take the room the lease waits or fails, as the caller chooses.

use std::{
    ops::{Deref, DerefMut},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Why a lease was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StagingError {
    /// The request alone is larger than the whole budget.
    #[error("staging request of {requested} bytes exceeds the staging budget of {budget} bytes")]
    TooLarge {
        /// Requested bytes.
        requested: u64,
        /// Budget.
        budget: u64,
    },
    /// The budget is taken by buffers still in use.
    #[error(
        "staging budget of {budget} bytes is in use ({in_use} bytes leased); {requested} more bytes do not fit"
    )]
    Exhausted {
        /// Requested bytes.
        requested: u64,
        /// Leased bytes.
        in_use: u64,
        /// Budget.
        budget: u64,
    },
}

/// Counters of a pool, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StagingStats {
    /// The configured budget.
    pub budget: u64,
    /// Bytes held by the pool (leased and free).
    pub allocated: u64,
    /// Bytes currently leased.
    pub in_use: u64,
    /// Highest `allocated` seen.
    pub peak_allocated: u64,
    /// Highest `in_use` seen.
    pub peak_in_use: u64,
    /// Leases served by a reused buffer.
    pub reused: u64,
    /// Leases that had to allocate.
    pub fresh: u64,
}

#[derive(Default)]
struct State {
    free: Vec<Vec<u8>>,
    stats: StagingStats,
}

struct Inner {
    state: Mutex<State>,
    cv: Condvar,
}

/// A budgeted pool of reusable, pre-faulted byte buffers. Cloning shares the pool.
#[derive(Clone)]
pub struct StagingPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingPool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl StagingPool {
    /// A pool that never holds more than `budget` bytes.
    pub fn new(budget: u64) -> Self {
        let state = State {
            free: Vec::new(),
            stats: StagingStats {
                budget,
                ..Default::default()
            },
        };
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                cv: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned pool still has consistent counters (updates are single statements).
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current counters.
    pub fn stats(&self) -> StagingStats {
        self.lock().stats
    }

    /// Leases `len` bytes now, or fails if they do not fit.
    pub fn try_lease(&self, len: usize) -> Result<StagingBuf, StagingError> {
        let mut st = self.lock();
        self.lease_locked(&mut st, len)
    }

    /// Leases `len` bytes, waiting up to `timeout` for leased buffers to come back.
    pub fn lease(&self, len: usize, timeout: Duration) -> Result<StagingBuf, StagingError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            match self.lease_locked(&mut st, len) {
                Err(StagingError::Exhausted { .. }) if Instant::now() < deadline => {
                    let wait = deadline.saturating_duration_since(Instant::now());
                    st = self
                        .inner
                        .cv
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                other => return other,
            }
        }
    }

    fn lease_locked(&self, st: &mut State, len: usize) -> Result<StagingBuf, StagingError> {
        let requested = len as u64;
        let budget = st.stats.budget;
        if requested > budget {
            return Err(StagingError::TooLarge { requested, budget });
        }
        // Best fit among free buffers.
        let best = st
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let mut buf = if let Some(i) = best {
            st.stats.reused += 1;
            st.free.swap_remove(i)
        } else {
            // Release free buffers (largest first) until the new one fits.
            st.free.sort_by_key(|b| b.capacity());
            while st.stats.allocated + requested > budget {
                match st.free.pop() {
                    Some(b) => st.stats.allocated -= b.capacity() as u64,
                    None => break,
                }
            }
            if st.stats.allocated + requested > budget {
                return Err(StagingError::Exhausted {
                    requested,
                    in_use: st.stats.in_use,
                    budget,
                });
            }
            // `vec![0; n]` would come from calloc, whose pages fault lazily inside the copy.
            #[allow(clippy::slow_vector_initialization)]
            let mut b = Vec::with_capacity(len);
            // Pre-fault: touching every page now keeps page faults out of the snapshot copy.
            b.resize(len, 0);
            st.stats.allocated += b.capacity() as u64;
            st.stats.peak_allocated = st.stats.peak_allocated.max(st.stats.allocated);
            st.stats.fresh += 1;
            b
        };
        if buf.len() < len {
            buf.resize(len, 0);
        } else {
            buf.truncate(len);
        }
        st.stats.in_use += buf.capacity() as u64;
        st.stats.peak_in_use = st.stats.peak_in_use.max(st.stats.in_use);
        Ok(StagingBuf {
            buf: Some(buf),
            pool: self.clone(),
        })
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut st = self.lock();
        st.stats.in_use -= buf.capacity() as u64;
        st.free.push(buf);
        drop(st);
        self.inner.cv.notify_all();
    }
}

/// A leased buffer; it goes back to its pool when dropped.
pub struct StagingBuf {
    buf: Option<Vec<u8>>,
    pool: StagingPool,
}

impl std::fmt::Debug for StagingBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StagingBuf({} bytes)", self.len())
    }
}

impl Deref for StagingBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or(&[])
    }
}

impl DerefMut for StagingBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or(&mut [])
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give_back(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_and_respects_budget() {
        let pool = StagingPool::new(1000);
        let a = pool.try_lease(600).unwrap();
        assert!(matches!(
            pool.try_lease(500),
            Err(StagingError::Exhausted { .. })
        ));
        drop(a);
        let b = pool.try_lease(500).unwrap();
        assert_eq!(pool.stats().reused, 1);
        drop(b);
        assert!(matches!(
            pool.try_lease(1001),
            Err(StagingError::TooLarge { .. })
        ));
        // A larger lease evicts the free buffer instead of exceeding the budget.
        let c = pool.try_lease(900).unwrap();
        assert_eq!(c.len(), 900);
        assert!(pool.stats().allocated <= 1000);
    }
}
