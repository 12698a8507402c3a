//! The on-disk layout of a checkpoint root: the names of its files and directories and the
//! manifest's format.
//!
//! ```text
//! ROOT/step-00000120/manifest.json   written last: every part's size and checksum
//! ROOT/step-00000120/<parts>
//! ROOT/latest                        name of the newest published checkpoint
//! ROOT/.tmp-*                        in flight; never read, removed at start-up
//! ROOT/.invalid-*                    invalid checkpoints moved aside by recovery
//! ROOT/.rewound-*                    checkpoints a run that started over moved aside
//! ROOT/.lock                         the writer lock
//! ```

pub use crate::manifest::{FORMAT_VERSION, FileEntry, MANIFEST_FILE};
pub use crate::naming::{
    LATEST_FILE, LOCK_FILE, REWOUND_PREFIX, checkpoint_dir_name, parse_step_dir,
};
