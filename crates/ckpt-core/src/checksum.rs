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

/// How [`read_hashed`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filled {
    /// The buffer was filled and the reader then ended: the digest of those bytes.
    Exactly(u64),
    /// The reader ended after this many bytes, before the buffer was full.
    Short(usize),
    /// The buffer was filled and the reader had more.
    Longer,
}

/// Fills `buf` from `r` and hashes it on the way, `chunk` bytes at a time: each chunk is hashed
/// right after it is read, while it is still in cache, so the bytes are brought through the
/// cache once. Then checks that `r` has nothing more.
pub(crate) fn read_hashed(mut r: impl Read, buf: &mut [u8], chunk: usize) -> io::Result<Filled> {
    let mut hasher = Xxh3::new();
    let mut filled = 0;
    for c in buf.chunks_mut(chunk.max(1)) {
        let mut got = 0;
        while got < c.len() {
            match r.read(&mut c[got..]) {
                Ok(0) => return Ok(Filled::Short(filled + got)),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        hasher.update(c);
        filled += got;
    }
    let mut probe = [0u8; 1];
    loop {
        match r.read(&mut probe) {
            Ok(0) => return Ok(Filled::Exactly(hasher.digest())),
            Ok(_) => return Ok(Filled::Longer),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_hashed_matches_the_one_shot_digest_and_sees_size_changes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for chunk in [1, 7, 4096, 1 << 20] {
            let mut buf = vec![0u8; data.len()];
            let got = read_hashed(&data[..], &mut buf, chunk).unwrap();
            assert_eq!(got, Filled::Exactly(of(&data)));
            assert_eq!(buf, data);
            let mut short = vec![0u8; data.len() + 5];
            assert_eq!(
                read_hashed(&data[..], &mut short, chunk).unwrap(),
                Filled::Short(data.len())
            );
            let mut long = vec![0u8; data.len() - 1];
            assert_eq!(
                read_hashed(&data[..], &mut long, chunk).unwrap(),
                Filled::Longer
            );
        }
        let mut empty: [u8; 0] = [];
        assert_eq!(
            read_hashed(&[][..], &mut empty, 8).unwrap(),
            Filled::Exactly(of(&[]))
        );
    }
}
