//! Progress of the run on stderr: a bar on a terminal, plain lines otherwise.

use std::{
    io::IsTerminal,
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressStyle};

/// Progress of the run: a bar on a terminal, plain lines otherwise.
pub(crate) struct Progress {
    pb: ProgressBar,
    tty: bool,
    start: Instant,
}

impl Progress {
    /// A bar of `total` units (hidden when stderr is not a terminal).
    pub(crate) fn new(total: u64) -> Self {
        let tty = std::io::stderr().is_terminal();
        let pb = if tty {
            let pb = ProgressBar::new(total);
            pb.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {wide_msg}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            pb.enable_steady_tick(Duration::from_millis(250));
            pb
        } else {
            ProgressBar::hidden()
        };
        Self {
            pb,
            tty,
            start: Instant::now(),
        }
    }

    /// A line that stays (a result or a phase).
    pub(crate) fn line(&self, msg: impl AsRef<str>) {
        let msg = format!(
            "[{:>6.1}s] {}",
            self.start.elapsed().as_secs_f64(),
            msg.as_ref()
        );
        if self.tty {
            self.pb.println(msg);
        } else {
            eprintln!("{msg}");
        }
    }

    /// The current activity (bar message only).
    pub(crate) fn status(&self, msg: impl Into<String>) {
        self.pb.set_message(msg.into());
    }

    /// One unit of work done.
    pub(crate) fn done_unit(&self) {
        self.pb.inc(1);
    }

    /// Removes the bar at the end of the measurements.
    pub(crate) fn finish(&self) {
        self.pb.finish_and_clear();
    }
}
