//! The backend-independent part of every group: frames, the point-to-point [`Link`] a backend
//! provides, and the collective algorithms built on it.
//!
//! All algorithms are stars around a root rank (rank 0 where the API has no root). A call has a
//! sequence number (`seq`, incremented on every call on every rank) and an operation code; both
//! travel in every frame, so a frame from a different call is detected. Frames of an *earlier*
//! call (left over after a failed call) are skipped. When the root fails it sends a best-effort
//! `Fail` frame to the other ranks so they fail promptly with the same kind of error.

use std::time::{Duration, Instant};

use super::{CHUNK_SIZE, Collective, CollectiveError, Result};

/// Length of the encoded frame header.
pub(crate) const HEADER_LEN: usize = 24;
/// Magic bytes in every encoded header (guards against foreign messages on a communicator).
const MAGIC: [u8; 2] = [0xC7, 0x5A];
/// `f32` elements per all-reduce frame.
const F32_CHUNK: usize = CHUNK_SIZE / 4;

/// Collective operations (frame `op` codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    AllReduce = 1,
    Broadcast = 2,
    Gather = 3,
    AllGather = 4,
    Barrier = 5,
    AllAgree = 6,
    Split = 7,
    SendRecv = 8,
}

impl Op {
    /// Name used in errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce_sum_f32",
            Op::Broadcast => "broadcast",
            Op::Gather => "gather",
            Op::AllGather => "all_gather",
            Op::Barrier => "barrier",
            Op::AllAgree => "all_agree",
            Op::Split => "split",
            Op::SendRecv => "send_recv",
        }
    }

    fn name_of(code: u8) -> String {
        [
            Op::AllReduce,
            Op::Broadcast,
            Op::Gather,
            Op::AllGather,
            Op::Barrier,
            Op::AllAgree,
            Op::Split,
            Op::SendRecv,
        ]
        .into_iter()
        .find(|op| *op as u8 == code)
        .map_or_else(|| format!("op#{code}"), |op| op.name().to_string())
    }
}

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Announces a buffer; `value` is its length (bytes, or `f32` elements for all-reduce).
    Start = 1,
    /// A chunk of the announced buffer (`payload`).
    Data = 2,
    /// A small value (`value`), e.g. a vote.
    Value = 3,
    /// The sender (a root) failed this call; `value` encodes the error, `payload` a detail text.
    Fail = 4,
}

impl Kind {
    fn name_of(code: u8) -> &'static str {
        match code {
            1 => "Start",
            2 => "Data",
            3 => "Value",
            4 => "Fail",
            _ => "unknown",
        }
    }
}

/// One message between two ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub seq: u64,
    pub op: u8,
    pub kind: u8,
    pub value: u64,
    pub payload: Vec<u8>,
}

impl Frame {
    fn new(seq: u64, op: Op, kind: Kind, value: u64, payload: Vec<u8>) -> Frame {
        Frame {
            seq,
            op: op as u8,
            kind: kind as u8,
            value,
            payload,
        }
    }

    /// Header followed by the payload (the MPI wire format).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.value.to_le_bytes());
        out.push(self.op);
        out.push(self.kind);
        out.extend_from_slice(&MAGIC);
        // Payloads never exceed CHUNK_SIZE (or a short error text), so this fits in u32.
        let len = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// Inverse of [`Frame::encode`]; `None` if `buf` is not a well-formed frame.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn decode(buf: &[u8]) -> Option<Frame> {
        let header = buf.get(..HEADER_LEN)?;
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(header.get(at..at + 8)?.try_into().ok()?))
        };
        let seq = u64_at(0)?;
        let value = u64_at(8)?;
        let (op, kind) = (header[16], header[17]);
        if header[18..20] != MAGIC {
            return None;
        }
        let len = u32::from_le_bytes(header[20..24].try_into().ok()?) as usize;
        let payload = buf.get(HEADER_LEN..)?;
        if payload.len() != len {
            return None;
        }
        Some(Frame {
            seq,
            op,
            kind,
            value,
            payload: payload.to_vec(),
        })
    }
}

/// Why a point-to-point transfer failed.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// The deadline passed.
    Timeout,
    /// The peer's endpoint is gone.
    Gone,
    /// Backend error.
    Backend(String),
}

/// Ordered, reliable point-to-point frames between the ranks of one group: what a backend
/// provides. Frames between one (src, dst) pair arrive in the order they were sent.
pub(crate) trait Link: Send {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sends `frame` to `dst`, waiting at most until `deadline` for the peer to accept it.
    fn send(
        &mut self,
        dst: usize,
        frame: Frame,
        deadline: Instant,
    ) -> std::result::Result<(), LinkError>;
    /// Receives the next frame from `src`, waiting at most until `deadline`.
    fn recv(&mut self, src: usize, deadline: Instant) -> std::result::Result<Frame, LinkError>;
    /// Best-effort send that must not block for long (failure notifications).
    fn notify(&mut self, dst: usize, frame: Frame);
    /// A new independent link over the same ranks, wrapped as a group with `timeout`.
    fn split(&mut self, timeout: Duration) -> Result<Box<dyn Collective>>;
}

/// Encodes an error for a `Fail` frame: (value, detail).
fn fail_encoding(err: &CollectiveError) -> (u64, String) {
    let peer_bits = |peer: Option<usize>| peer.map_or(0, |p| (p as u64 + 1) << 8);
    match err {
        CollectiveError::Timeout { peer, .. } => (1 | peer_bits(*peer), String::new()),
        CollectiveError::PeerGone { peer, .. } => (2 | peer_bits(Some(*peer)), String::new()),
        CollectiveError::Mismatch { detail, .. } => (3, detail.clone()),
        other => (4, other.to_string()),
    }
}

/// A group member: a link plus the call sequence and timeout; implements the algorithms.
pub(crate) struct Engine<L> {
    link: L,
    seq: u64,
    timeout: Duration,
}

impl<L: Link> Engine<L> {
    pub(crate) fn new(link: L, timeout: Duration) -> Self {
        Engine {
            link,
            seq: 0,
            timeout,
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.link.rank()
    }

    pub(crate) fn size(&self) -> usize {
        self.link.size()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    fn deadline(&self) -> Instant {
        let now = Instant::now();
        now.checked_add(self.timeout)
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
    }

    fn link_error(&self, op: Op, peer: usize, e: LinkError) -> CollectiveError {
        match e {
            LinkError::Timeout => CollectiveError::Timeout {
                op: op.name(),
                rank: self.rank(),
                peer: Some(peer),
                after: self.timeout,
            },
            LinkError::Gone => CollectiveError::PeerGone {
                op: op.name(),
                rank: self.rank(),
                peer,
            },
            LinkError::Backend(m) => CollectiveError::Mpi(m),
        }
    }

    fn mismatch(&self, op: Op, detail: String) -> CollectiveError {
        CollectiveError::Mismatch {
            op: op.name(),
            rank: self.rank(),
            detail,
        }
    }

    fn send(&mut self, op: Op, dst: usize, kind: Kind, value: u64, payload: Vec<u8>) -> Result<()> {
        let frame = Frame::new(self.seq, op, kind, value, payload);
        let deadline = self.deadline();
        match self.link.send(dst, frame, deadline) {
            Ok(()) => Ok(()),
            // A root that failed the call tells everyone why, then may leave before this rank
            // reads it: report its reason, not only that it is gone.
            Err(LinkError::Gone) => Err(self
                .pending_failure(op, dst)
                .unwrap_or_else(|| self.link_error(op, dst, LinkError::Gone))),
            Err(e) => Err(self.link_error(op, dst, e)),
        }
    }

    /// The `Fail` notice of the current call that `peer` left behind, if it is waiting.
    fn pending_failure(&mut self, op: Op, peer: usize) -> Option<CollectiveError> {
        let now = Instant::now();
        while let Ok(frame) = self.link.recv(peer, now) {
            if frame.seq == self.seq && frame.kind == Kind::Fail as u8 {
                return Some(self.relayed_error(op, peer, &frame));
            }
        }
        None
    }

    /// Receives the next frame of the current call from `src`, which must be of `kind`.
    fn recv(&mut self, op: Op, src: usize, kind: Kind) -> Result<Frame> {
        let deadline = self.deadline();
        loop {
            let frame = self
                .link
                .recv(src, deadline)
                .map_err(|e| self.link_error(op, src, e))?;
            if frame.seq < self.seq {
                continue; // left over from an earlier, failed call
            }
            if frame.seq == self.seq && frame.kind == Kind::Fail as u8 {
                return Err(self.relayed_error(op, src, &frame));
            }
            if frame.seq != self.seq || frame.op != op as u8 || frame.kind != kind as u8 {
                return Err(self.mismatch(
                    op,
                    format!(
                        "expected {} #{} {:?} from rank {src}, got {} #{} {}",
                        op.name(),
                        self.seq,
                        kind,
                        Op::name_of(frame.op),
                        frame.seq,
                        Kind::name_of(frame.kind),
                    ),
                ));
            }
            return Ok(frame);
        }
    }

    fn relayed_error(&self, op: Op, src: usize, frame: &Frame) -> CollectiveError {
        let peer = match frame.value >> 8 {
            0 => None,
            p => Some((p - 1) as usize),
        };
        let detail = String::from_utf8_lossy(&frame.payload).into_owned();
        match frame.value & 0xff {
            1 => CollectiveError::Timeout {
                op: op.name(),
                rank: self.rank(),
                peer,
                after: self.timeout,
            },
            2 => CollectiveError::PeerGone {
                op: op.name(),
                rank: self.rank(),
                peer: peer.unwrap_or(src),
            },
            3 => self.mismatch(op, format!("reported by rank {src}: {detail}")),
            _ => CollectiveError::Mpi(format!("rank {src} failed {}: {detail}", op.name())),
        }
    }

    /// Root side: tell every other rank that this call failed (best effort), return `err`.
    fn fail_others(&mut self, op: Op, err: CollectiveError) -> CollectiveError {
        let (value, detail) = fail_encoding(&err);
        let me = self.rank();
        for r in (0..self.size()).filter(|&r| r != me) {
            let frame = Frame::new(self.seq, op, Kind::Fail, value, detail.clone().into_bytes());
            self.link.notify(r, frame);
        }
        err
    }

    fn check_root(&self, op: Op, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(CollectiveError::InvalidArgument(format!(
                "{}: root {root} is not a rank of a group of size {}",
                op.name(),
                self.size()
            )));
        }
        Ok(())
    }

    fn begin(&mut self) {
        self.seq += 1;
    }

    /// Sends a buffer (Start + Data chunks) to one rank.
    fn send_buffer(&mut self, op: Op, dst: usize, data: &[u8]) -> Result<()> {
        self.send(op, dst, Kind::Start, data.len() as u64, Vec::new())?;
        for chunk in data.chunks(CHUNK_SIZE) {
            self.send(op, dst, Kind::Data, 0, chunk.to_vec())?;
        }
        Ok(())
    }

    /// Receives one Data frame that must carry exactly `expected` bytes.
    fn recv_chunk(&mut self, op: Op, src: usize, expected: usize) -> Result<Vec<u8>> {
        let frame = self.recv(op, src, Kind::Data)?;
        if frame.payload.len() != expected {
            return Err(self.mismatch(
                op,
                format!(
                    "rank {src} sent a chunk of {} bytes, expected {expected}",
                    frame.payload.len()
                ),
            ));
        }
        Ok(frame.payload)
    }

    /// Receives a buffer (Start + Data chunks) from one rank.
    fn recv_buffer(&mut self, op: Op, src: usize) -> Result<Vec<u8>> {
        let start = self.recv(op, src, Kind::Start)?;
        let len = self.announced_len(op, src, start.value)?;
        let mut out = Vec::new();
        self.reserve(op, &mut out, len)?;
        while out.len() < len {
            let want = (len - out.len()).min(CHUNK_SIZE);
            let chunk = self.recv_chunk(op, src, want)?;
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn announced_len(&self, op: Op, src: usize, value: u64) -> Result<usize> {
        usize::try_from(value).map_err(|_| {
            self.mismatch(
                op,
                format!("rank {src} announced an impossible length {value}"),
            )
        })
    }

    fn reserve(&self, op: Op, out: &mut Vec<u8>, len: usize) -> Result<()> {
        out.try_reserve_exact(len).map_err(|e| {
            CollectiveError::InvalidArgument(format!(
                "{}: cannot allocate {len} bytes: {e}",
                op.name()
            ))
        })
    }

    /// Root side of a gather: every other rank's buffer, received round-robin chunk by chunk.
    fn gather_at_root(&mut self, op: Op, own: &[u8]) -> Result<Vec<Vec<u8>>> {
        let me = self.rank();
        let n = self.size();
        let mut lens = vec![0usize; n];
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
        for r in (0..n).filter(|&r| r != me) {
            let start = self.recv(op, r, Kind::Start)?;
            lens[r] = self.announced_len(op, r, start.value)?;
            let mut buf = Vec::new();
            self.reserve(op, &mut buf, lens[r])?;
            out[r] = buf;
        }
        out[me] = own.to_vec();
        loop {
            let mut pending = false;
            for r in (0..n).filter(|&r| r != me) {
                let left = lens[r] - out[r].len();
                if left > 0 {
                    let chunk = self.recv_chunk(op, r, left.min(CHUNK_SIZE))?;
                    out[r].extend_from_slice(&chunk);
                    pending |= out[r].len() < lens[r];
                }
            }
            if !pending {
                return Ok(out);
            }
        }
    }

    /// Root side of a broadcast of `data` to `dsts`: Start to all, then chunks round-robin.
    fn broadcast_from_root(&mut self, op: Op, dsts: &[usize], data: &[u8]) -> Result<()> {
        for &r in dsts {
            self.send(op, r, Kind::Start, data.len() as u64, Vec::new())?;
        }
        for chunk in data.chunks(CHUNK_SIZE) {
            for &r in dsts {
                self.send(op, r, Kind::Data, 0, chunk.to_vec())?;
            }
        }
        Ok(())
    }

    fn others(&self) -> Vec<usize> {
        let me = self.rank();
        (0..self.size()).filter(|&r| r != me).collect()
    }

    pub(crate) fn all_reduce_sum_f32(&mut self, data: &mut [f32]) -> Result<()> {
        const OP: Op = Op::AllReduce;
        self.begin();
        if self.size() == 1 {
            return Ok(());
        }
        if self.rank() != 0 {
            self.send(OP, 0, Kind::Start, data.len() as u64, Vec::new())?;
            let ack = self.recv(OP, 0, Kind::Start)?;
            if ack.value != data.len() as u64 {
                return Err(self.mismatch(OP, "root acknowledged a different length".into()));
            }
            for chunk in data.chunks_mut(F32_CHUNK) {
                self.send(OP, 0, Kind::Data, 0, f32_to_bytes(chunk))?;
                let sum = self.recv_chunk(OP, 0, chunk.len() * 4)?;
                bytes_to_f32(&sum, chunk);
            }
            return Ok(());
        }
        match self.all_reduce_root(data) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail_others(OP, e)),
        }
    }

    fn all_reduce_root(&mut self, data: &mut [f32]) -> Result<()> {
        const OP: Op = Op::AllReduce;
        let others = self.others();
        let mut bad = Vec::new();
        for &r in &others {
            let start = self.recv(OP, r, Kind::Start)?;
            if start.value != data.len() as u64 {
                bad.push(format!("rank {r} has {} elements", start.value));
            }
        }
        if !bad.is_empty() {
            return Err(self.mismatch(
                OP,
                format!("rank 0 has {} elements, {}", data.len(), bad.join(", ")),
            ));
        }
        for &r in &others {
            self.send(OP, r, Kind::Start, data.len() as u64, Vec::new())?;
        }
        let n = self.size();
        for chunk in data.chunks_mut(F32_CHUNK) {
            let mut parts: Vec<Vec<f32>> = Vec::with_capacity(n);
            parts.push(chunk.to_vec());
            for &r in &others {
                let bytes = self.recv_chunk(OP, r, chunk.len() * 4)?;
                let mut part = vec![0f32; chunk.len()];
                bytes_to_f32(&bytes, &mut part);
                parts.push(part);
            }
            let refs: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
            let sum = tree_sum(&refs);
            chunk.copy_from_slice(&sum);
            let bytes = f32_to_bytes(chunk);
            for &r in &others {
                self.send(OP, r, Kind::Data, 0, bytes.clone())?;
            }
        }
        Ok(())
    }

    pub(crate) fn broadcast(&mut self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        const OP: Op = Op::Broadcast;
        self.check_root(OP, root)?;
        self.begin();
        if self.size() == 1 {
            return Ok(());
        }
        if self.rank() == root {
            let others = self.others();
            return match self.broadcast_from_root(OP, &others, data) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.fail_others(OP, e)),
            };
        }
        *data = self.recv_buffer(OP, root)?;
        Ok(())
    }

    pub(crate) fn gather(&mut self, root: usize, data: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        const OP: Op = Op::Gather;
        self.check_root(OP, root)?;
        self.begin();
        if self.size() == 1 {
            return Ok(Some(vec![data.to_vec()]));
        }
        if self.rank() != root {
            self.send_buffer(OP, root, data)?;
            return Ok(None);
        }
        match self.gather_at_root(OP, data) {
            Ok(all) => Ok(Some(all)),
            Err(e) => Err(self.fail_others(OP, e)),
        }
    }

    pub(crate) fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        const OP: Op = Op::AllGather;
        self.begin();
        let me = self.rank();
        let n = self.size();
        if n == 1 {
            return Ok(vec![data.to_vec()]);
        }
        if me != 0 {
            self.send_buffer(OP, 0, data)?;
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                if i == me {
                    out.push(data.to_vec());
                } else {
                    out.push(self.recv_buffer(OP, 0)?);
                }
            }
            return Ok(out);
        }
        let result = self.gather_at_root(OP, data).and_then(|all| {
            for (i, buf) in all.iter().enumerate() {
                // Rank i already has its own buffer.
                let dsts: Vec<usize> = (1..n).filter(|&r| r != i).collect();
                self.broadcast_from_root(OP, &dsts, buf)?;
            }
            Ok(all)
        });
        result.map_err(|e| self.fail_others(OP, e))
    }

    /// AND of one flag per rank, result on every rank (barrier and all_agree).
    fn vote(&mut self, op: Op, ok: bool) -> Result<bool> {
        self.begin();
        if self.size() == 1 {
            return Ok(ok);
        }
        if self.rank() != 0 {
            self.send(op, 0, Kind::Value, u64::from(ok), Vec::new())?;
            return Ok(self.recv(op, 0, Kind::Value)?.value == 1);
        }
        let others = self.others();
        let result = (|| {
            let mut all = ok;
            for &r in &others {
                all &= self.recv(op, r, Kind::Value)?.value == 1;
            }
            for &r in &others {
                self.send(op, r, Kind::Value, u64::from(all), Vec::new())?;
            }
            Ok(all)
        })();
        result.map_err(|e| self.fail_others(op, e))
    }

    pub(crate) fn barrier(&mut self) -> Result<()> {
        self.vote(Op::Barrier, true).map(|_| ())
    }

    pub(crate) fn all_agree(&mut self, ok: bool) -> Result<bool> {
        self.vote(Op::AllAgree, ok)
    }

    /// Point-to-point within a collective call: sends `data` to `to` and receives a buffer
    /// from `from`. A rank receives first when `from` is a lower rank, else sends first, so
    /// every cycle of transfers has a rank that sends first (its lowest) and no two ranks wait
    /// on each other, also where a send completes only once the peer receives (MPI).
    pub(crate) fn send_recv(
        &mut self,
        to: Option<usize>,
        data: &[u8],
        from: Option<usize>,
    ) -> Result<Option<Vec<u8>>> {
        const OP: Op = Op::SendRecv;
        let me = self.rank();
        for peer in to.iter().chain(from.iter()) {
            self.check_root(OP, *peer)?;
            if *peer == me {
                return Err(CollectiveError::InvalidArgument(format!(
                    "{}: rank {me} cannot send to or receive from itself",
                    OP.name()
                )));
            }
        }
        self.begin();
        let receive_first = from.is_some_and(|f| f < me);
        let mut got = None;
        if receive_first && let Some(f) = from {
            got = Some(self.recv_buffer(OP, f)?);
        }
        if let Some(t) = to {
            self.send_buffer(OP, t, data)?;
        }
        if !receive_first && let Some(f) = from {
            got = Some(self.recv_buffer(OP, f)?);
        }
        Ok(got)
    }

    pub(crate) fn split(&mut self) -> Result<Box<dyn Collective>> {
        self.begin();
        let timeout = self.timeout;
        self.link.split(timeout)
    }
}

/// Implements [`Collective`] for a newtype `$ty { engine: Engine<_> }` by delegation.
macro_rules! delegate_collective {
    ($ty:ty) => {
        impl $crate::collective::Collective for $ty {
            fn rank(&self) -> usize {
                self.engine.rank()
            }
            fn size(&self) -> usize {
                self.engine.size()
            }
            fn timeout(&self) -> ::std::time::Duration {
                self.engine.timeout()
            }
            fn set_timeout(&mut self, t: ::std::time::Duration) {
                self.engine.set_timeout(t)
            }
            fn all_reduce_sum_f32(&mut self, data: &mut [f32]) -> $crate::collective::Result<()> {
                self.engine.all_reduce_sum_f32(data)
            }
            fn broadcast(
                &mut self,
                root: usize,
                data: &mut Vec<u8>,
            ) -> $crate::collective::Result<()> {
                self.engine.broadcast(root, data)
            }
            fn gather(
                &mut self,
                root: usize,
                data: &[u8],
            ) -> $crate::collective::Result<Option<Vec<Vec<u8>>>> {
                self.engine.gather(root, data)
            }
            fn all_gather(&mut self, data: &[u8]) -> $crate::collective::Result<Vec<Vec<u8>>> {
                self.engine.all_gather(data)
            }
            fn barrier(&mut self) -> $crate::collective::Result<()> {
                self.engine.barrier()
            }
            fn all_agree(&mut self, ok: bool) -> $crate::collective::Result<bool> {
                self.engine.all_agree(ok)
            }
            fn send_recv(
                &mut self,
                to: Option<usize>,
                data: &[u8],
                from: Option<usize>,
            ) -> $crate::collective::Result<Option<Vec<u8>>> {
                self.engine.send_recv(to, data, from)
            }
            fn split(
                &mut self,
            ) -> $crate::collective::Result<Box<dyn $crate::collective::Collective>> {
                self.engine.split()
            }
        }
    };
}
pub(crate) use delegate_collective;

/// Fixed pairwise tree sum over `parts` (one slice per rank, in rank order, equal lengths):
/// the range is split at `next_power_of_two(len) / 2`, recursively.
pub(crate) fn tree_sum(parts: &[&[f32]]) -> Vec<f32> {
    match parts {
        [] => Vec::new(),
        [one] => one.to_vec(),
        _ => {
            let mid = parts.len().next_power_of_two() / 2;
            let left = tree_sum(&parts[..mid]);
            let right = tree_sum(&parts[mid..]);
            left.iter().zip(&right).map(|(a, b)| a + b).collect()
        }
    }
}

fn f32_to_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_to_f32(bytes: &[u8], out: &mut [f32]) {
    for (x, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_roundtrip_and_rejects_garbage() {
        let f = Frame::new(7, Op::Gather, Kind::Data, 42, vec![1, 2, 3]);
        let bytes = f.encode();
        assert_eq!(bytes.len(), HEADER_LEN + 3);
        assert_eq!(Frame::decode(&bytes), Some(f));
        assert_eq!(Frame::decode(&bytes[..bytes.len() - 1]), None);
        let mut bad = bytes.clone();
        bad[18] ^= 1;
        assert_eq!(Frame::decode(&bad), None);
    }

    #[test]
    fn tree_sum_shape() {
        let v = |x: f32| vec![x];
        let (a, b, c, d) = (v(1e8), v(1.0), v(-1e8), v(1.0));
        // (a+b)+c = 0 in f32 (1 is lost), a+(b+c) would also differ; 4: (a+b)+(c+d) = 0.
        assert_eq!(tree_sum(&[&a, &b, &c]), vec![(1e8f32 + 1.0) + -1e8]);
        assert_eq!(
            tree_sum(&[&a, &b, &c, &d]),
            vec![(1e8f32 + 1.0) + (-1e8f32 + 1.0)]
        );
        assert_eq!(tree_sum(&[&a, &b]), vec![1e8f32 + 1.0]);
    }
}
