//! Streaming checksums (XXH3-64): fast enough (tens of GB/s) to run inline with writes.

use std::io::{self, Read, Write};
use xxhash_rust::xxh3::Xxh3;

/// Formats a digest the way manifests store it.
pub(crate) fn hex(d: u64) -> String {
    format!("{d:016x}")
}

/// Checksum of a byte slice.
pub(crate) fn of(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// A writer that hashes and counts everything passing through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Xxh3,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Xxh3::new(),
            written: 0,
        }
    }
    pub(crate) fn finish(self) -> (W, u64, u64) {
        (self.inner, self.hasher.digest(), self.written)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Hashes a whole reader; returns (digest, length).
pub(crate) fn of_reader(mut r: impl Read) -> io::Result<(u64, u64)> {
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hasher.digest(), len))
}
