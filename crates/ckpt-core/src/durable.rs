//! Files written and made durable outside a snapshot, then adopted into one.
//!
//! Sharded checkpoints let every rank write its own shard in parallel: each rank writes its file
//! with [`write_durable_file`] (in the checkpoint root, under a `.tmp-` name that start-up
//! recovery removes if the run dies), sends the resulting [`DurableFile`] (path, size, checksum)
//! to the rank that publishes, and that rank adds it to its snapshot with
//! [`crate::Snapshot::with_adopted`]. Publishing renames the file into the checkpoint directory,
//! checks its size, and records the checksum the writer computed while writing.

use std::{
    io::{self, BufWriter, Write},
    path::PathBuf,
};

use crate::{checksum::HashingWriter, failpoints::durability_step, storage::StoragePath};

/// A file that is complete and fsynced, with the size and XXH3-64 computed while writing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableFile {
    /// Where the file is now.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// XXH3-64 of the contents.
    pub xxh3: u64,
}

/// Writes the file `at` (which must not exist) through `fill`, fsyncs it, and returns its size
/// and checksum. On error the partial file is removed. The file's data is durable when this
/// returns; its name is not (the publisher's rename into the checkpoint and the syncs after it
/// are what make it part of a durable checkpoint).
///
/// `at` is a path on the local disk, or a [`StoragePath`] on another storage.
pub fn write_durable_file<'a>(
    at: impl Into<StoragePath<'a>>,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<DurableFile> {
    let StoragePath { storage, path } = at.into();
    let result = (|| {
        let file = storage.create_file(path)?;
        let mut w = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
        fill(&mut w)?;
        w.flush()?;
        let (buf, digest, size) = w.finish();
        let mut file = buf.into_inner().map_err(|e| e.into_error())?;
        durability_step!(FSYNC_DURABLE_FILE, file.sync())?;
        Ok(DurableFile {
            path: path.to_path_buf(),
            size,
            xxh3: digest,
        })
    })();
    if result.is_err() {
        let _ = storage.remove_file(path);
    }
    result
}
