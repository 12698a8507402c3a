//! The results of a background uploader, as its owner collects them: a count of uploads
//! queued and not finished (shared with whoever queues them), and every upload made so far.
//! [`crate::Uploader`] and ckpt-zero's per-rank uploader both collect through it.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use crossbeam_channel::Receiver;

use crate::Uploaded;

/// Finished uploads coming back from a worker thread (see the module docs).
#[derive(Debug)]
pub struct Completions<E> {
    done: Receiver<Result<Uploaded, E>>,
    pending: Arc<AtomicUsize>,
    uploaded: Vec<Uploaded>,
}

impl<E> Completions<E> {
    /// Results arrive on `done`; each one queued must be counted with [`Self::queued`].
    pub fn new(done: Receiver<Result<Uploaded, E>>) -> Self {
        Self {
            done,
            pending: Arc::default(),
            uploaded: Vec::new(),
        }
    }

    /// The counter of uploads queued and not finished, for a queuing side on another thread.
    pub fn counter(&self) -> Arc<AtomicUsize> {
        self.pending.clone()
    }

    /// Counts one more queued upload.
    pub fn queued(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    /// Uploads queued and not finished.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Uploads finished since the last call, waiting for every pending one when `block`; the
    /// first failure, if any, as an error (without `block`, at most up to it). When the worker
    /// is gone with uploads pending, the pending count is dropped and `gone()` is the error
    /// unless a failure came first.
    pub fn collect(&mut self, block: bool, gone: impl Fn() -> E) -> Result<Vec<Uploaded>, E> {
        let mut out = Vec::new();
        let mut first_err = None;
        loop {
            let next = if block && self.pending() > 0 {
                match self.done.recv() {
                    Ok(r) => Some(r),
                    Err(_) => {
                        self.pending.store(0, Ordering::Relaxed);
                        first_err.get_or_insert_with(&gone);
                        break;
                    }
                }
            } else {
                self.done.try_recv().ok()
            };
            let Some(r) = next else { break };
            let _ = self
                .pending
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            match r {
                Ok(u) => out.push(u),
                Err(e) => {
                    first_err.get_or_insert(e);
                    if !block {
                        break;
                    }
                }
            }
        }
        self.uploaded.extend(out.iter().cloned());
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Every upload collected so far, taken.
    pub fn take_all(&mut self) -> Vec<Uploaded> {
        std::mem::take(&mut self.uploaded)
    }
}
