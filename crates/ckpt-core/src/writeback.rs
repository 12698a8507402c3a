//! Early writeback: a file writer that asks the kernel to start writing each few MiB to disk
//! as soon as they are written (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not
//! wait), so the disk works while the next chunk is copied and hashed and the final `fsync`
//! only waits for the tail. RocksDB's `bytes_per_sync` does the same. Durability still comes
//! from the `fsync` the publisher issues; this only moves disk work earlier.

use std::fs::File;
use std::io::{self, Write};

/// Bytes between writeback requests.
const WRITEBACK_EVERY: u64 = 8 << 20;

/// A [`File`] writer that starts writeback of every [`WRITEBACK_EVERY`] bytes written.
pub(crate) struct WritebackFile {
    file: File,
    written: u64,
    flushed_to: u64,
}

impl WritebackFile {
    pub(crate) fn new(file: File) -> Self {
        Self {
            file,
            written: 0,
            flushed_to: 0,
        }
    }

    /// The file, for the final `fsync`.
    #[cfg(test)]
    pub(crate) fn into_inner(self) -> File {
        self.file
    }

    /// The file, for the final `fsync`.
    pub(crate) fn get_ref(&self) -> &File {
        &self.file
    }

    /// Books `n` bytes written to the file past this writer (direct I/O), so later writeback
    /// requests cover only what this writer wrote.
    pub(crate) fn advance(&mut self, n: u64) {
        self.written += n;
        self.flushed_to = self.written;
    }

    fn start_writeback(&mut self) {
        let (from, len) = (self.flushed_to, self.written - self.flushed_to);
        self.flushed_to = self.written;
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain syscall on an open descriptor; a failure only means no early
            // writeback (the fsync that follows is what makes the data durable).
            unsafe {
                libc::sync_file_range(
                    self.file.as_raw_fd(),
                    from as libc::off64_t,
                    len as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (from, len);
    }
}

impl Write for WritebackFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.flushed_to >= WRITEBACK_EVERY {
            self.start_writeback();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn writes_everything_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(20u32 << 20) + 7).map(|i| (i % 251) as u8).collect();
        let mut w = WritebackFile::new(File::create(&path).unwrap());
        for c in data.chunks(3 << 20) {
            w.write_all(c).unwrap();
        }
        w.flush().unwrap();
        let f = w.into_inner();
        f.sync_all().unwrap();
        let mut back = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
    }
}
