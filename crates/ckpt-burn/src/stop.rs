//! Stopping training on SIGTERM/SIGINT with a final checkpoint (opt-in: a library never
//! installs a signal handler by itself): Burn's learner through its interrupter, or a loop of
//! one's own through a flag ([`StopOnSignal::install_flag`], for
//! [`crate::ManagerConfig::stop_on`]).
//!
//! [`StopOnSignal::install`] handles both signals on a dedicated thread (signal-hook's
//! self-pipe iterator, no code of ours in the handler). The first signal asks Burn's
//! [`Interrupter`] to stop: [`crate::strategy::CkptTrainingStrategy`] finishes the step under
//! way and writes a final checkpoint at that step boundary (its `save_on_stop`, on by
//! default). [`crate::checkpointers::CkptCheckpointers::finish_within`] then waits for it to be
//! durable within a grace period. A second signal exits the process at once with status
//! 128 + N: an unfinished checkpoint is not published, the newest published one is intact.
//!
//! ```no_run
//! # use burn::train::{Learner, SupervisedTraining, LearnerModel};
//! # fn demo<M: LearnerModel>(training: SupervisedTraining<M>, learner: Learner<M>,
//! #     ckpt: ckpt_burn::checkpointers::CkptCheckpointers) -> Result<(), ckpt_burn::Error> {
//! use std::time::Duration;
//! let stop = ckpt_burn::stop::StopOnSignal::install(training.interrupter())?;
//! let result = training.launch(learner);
//! ckpt.finish_within(Duration::from_secs(60))?; // the final checkpoint is durable
//! if let Some(sig) = stop.received() { eprintln!("stopped by signal {sig}"); }
//! # Ok(()) }
//! ```

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicI32, Ordering},
};
use std::thread::JoinHandle;

use burn::train::Interrupter;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::{Error, Result};

/// Actions registered when a [`StopOnSignal`] was dropped, each making its signal end the
/// process as its default action would; the next install removes them.
static DEFAULTS_RESTORED: Mutex<Vec<signal_hook::SigId>> = Mutex::new(Vec::new());

/// The signal thread; dropping it stops handling the signals, and SIGTERM and SIGINT then end
/// the process as they would without a handler (signal-hook alone would leave them ignored).
#[derive(Debug)]
#[must_use = "dropping it stops handling the signals: keep it alive for the whole run"]
pub struct StopOnSignal {
    received: Arc<AtomicI32>,
    handle: signal_hook::iterator::Handle,
    thread: Option<JoinHandle<()>>,
}

fn name(sig: i32) -> &'static str {
    match sig {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// What the first signal stops.
enum Target {
    Learner(Interrupter),
    Flag(Arc<AtomicBool>),
}

impl Target {
    fn stop(&self, why: &str) {
        match self {
            Target::Learner(i) => i.stop(Some(why)),
            Target::Flag(f) => f.store(true, Ordering::SeqCst),
        }
    }
}

impl StopOnSignal {
    /// Handles SIGTERM and SIGINT: the first stops training through `interrupter` (pass
    /// `SupervisedTraining::interrupter()`), a second exits at once with 128 + N. Each is a
    /// warning.
    pub fn install(interrupter: Interrupter) -> Result<Self> {
        Self::start(Target::Learner(interrupter))
    }

    /// Handles SIGTERM and SIGINT for a loop of one's own: the first sets `flag` (give the same
    /// flag to [`crate::ManagerConfig::stop_on`]: the next `step` saves that step and returns
    /// `true`), a second exits at once with 128 + N. Each is a warning.
    ///
    /// ```no_run
    /// use std::sync::{Arc, atomic::AtomicBool};
    /// use std::time::Duration;
    /// use ckpt_burn::{ManagerConfig, stop::StopOnSignal};
    ///
    /// let flag = Arc::new(AtomicBool::new(false));
    /// let _signals = StopOnSignal::install_flag(flag.clone())?;
    /// let config = ManagerConfig::new("runs/x").stop_on(flag, Some(Duration::from_secs(60)));
    /// # Ok::<(), ckpt_burn::Error>(())
    /// ```
    pub fn install_flag(flag: Arc<AtomicBool>) -> Result<Self> {
        Self::start(Target::Flag(flag))
    }

    fn start(target: Target) -> Result<Self> {
        for id in DEFAULTS_RESTORED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            signal_hook::low_level::unregister(id);
        }
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
            .map_err(|e| Error::Config(format!("cannot handle SIGTERM/SIGINT: {e}")))?;
        let handle = signals.handle();
        let received = Arc::new(AtomicI32::new(0));
        let first = received.clone();
        let thread = std::thread::Builder::new()
            .name("ckpt-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if first
                        .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        tracing::warn!(
                            "received {}: stopping at the next step boundary and writing a \
                             final checkpoint (send it again to exit at once)",
                            name(sig)
                        );
                        target.stop(&format!("stopped by {}", name(sig)));
                    } else {
                        tracing::warn!(
                            "received {} again: exiting at once; an unfinished checkpoint is \
                             not published (the newest published one is intact)",
                            name(sig)
                        );
                        signal_hook::low_level::exit(128 + sig);
                    }
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the signal thread: {e}")))?;
        Ok(Self {
            received,
            handle,
            thread: Some(thread),
        })
    }

    /// The first signal received, if any.
    pub fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }
}

impl Drop for StopOnSignal {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // signal-hook keeps its process-wide handler installed with no action left, which
        // would ignore these signals from now on: give them back their default effect.
        let mut restored = DEFAULTS_RESTORED.lock().unwrap_or_else(|e| e.into_inner());
        for sig in [SIGTERM, SIGINT] {
            let always = Arc::new(AtomicBool::new(true));
            match signal_hook::flag::register_conditional_default(sig, always) {
                Ok(id) => restored.push(id),
                Err(e) => tracing::warn!(
                    "{} stays ignored after the stop handler was dropped: {e}",
                    name(sig)
                ),
            }
        }
    }
}
