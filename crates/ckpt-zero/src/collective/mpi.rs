//! [`MpiGroup`]: a group whose ranks are MPI processes (cargo feature `mpi`, rsmpi 0.8).
//!
//! * MPI is initialized once per process by [`MpiGroup::world`], with `MPI_THREAD_MULTIPLE`
//!   (an error if the library does not provide it). The universe is leaked so that groups on
//!   background threads stay valid; MPI is finalized only by an explicit [`finalize`] at the
//!   end of `main`. Do call it on a clean exit: Open MPI's `mpirun` treats a rank that exits
//!   without `MPI_Finalize` as an abnormal termination and exits non-zero. If the application
//!   initialized MPI itself, it must have asked for `MPI_THREAD_MULTIPLE` too (and then it
//!   finalizes MPI itself).
//! * A panic hook calls `MPI_Abort` on `MPI_COMM_WORLD`, so a panicking rank kills the whole
//!   job instead of leaving the other ranks waiting.
//! * Each group owns its own communicator: [`MpiGroup::world`] duplicates `MPI_COMM_WORLD` and
//!   [`Collective::split`] duplicates the group's communicator (`MPI_Comm_dup`). Create groups on
//!   the main thread, in the same order on every rank, before handing them to other threads:
//!   concurrent `MPI_Comm_dup` from several threads is fragile in MPI implementations.
//! * Collectives are built on non-blocking point-to-point messages (`MPI_Isend`/`MPI_Irecv` of
//!   frames of at most [`super::CHUNK_SIZE`] bytes plus a header), completed by
//!   polling `MPI_Test` with short sleeps that back off up to 1 ms, so waiting neither spins a
//!   core nor ignores the deadline. `MPI_Allreduce` is not used (its summation order is
//!   unspecified); sums use the same fixed tree as every other backend.
//! * A dead MPI process is not reported by MPI to its peers; the launcher (`mpirun`) kills the
//!   job, and until then peers see [`super::CollectiveError::Timeout`].

use std::mem::ManuallyDrop;
use std::sync::OnceLock;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use ::mpi::Tag;
use ::mpi::datatype::Equivalence;
use ::mpi::environment::{self, Threading};
use ::mpi::request::StaticScope;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator, Destination, Source};

use super::engine::{Engine, Frame, HEADER_LEN, Link, LinkError, delegate_collective};
use super::{CHUNK_SIZE, Collective, CollectiveError, Result};

/// The message tag of all frames (each group has its own communicator, so one tag suffices;
/// MPI keeps messages of one (source, tag, communicator) in order).
const TAG: Tag = 0x5A7;
/// Longest sleep between two polls of a pending request.
const MAX_POLL_SLEEP: Duration = Duration::from_millis(1);
/// How long a best-effort failure notification may take.
const NOTIFY_WAIT: Duration = Duration::from_millis(100);

/// One rank's member of a group of MPI processes.
pub struct MpiGroup {
    engine: Engine<MpiLink>,
}

impl MpiGroup {
    /// Initializes MPI if needed (once per process, `MPI_THREAD_MULTIPLE`, abort-on-panic hook)
    /// and returns a group of all processes of the job on a private duplicate of
    /// `MPI_COMM_WORLD`. Collective over all processes: call it on the main thread of every rank.
    pub fn world(timeout: Duration) -> Result<MpiGroup> {
        init()?;
        Self::from_comm(SimpleCommunicator::world().duplicate(), timeout)
    }

    fn from_comm(comm: SimpleCommunicator, timeout: Duration) -> Result<MpiGroup> {
        let rank = usize::try_from(comm.rank())
            .map_err(|_| CollectiveError::Mpi(format!("negative rank {}", comm.rank())))?;
        let size = usize::try_from(comm.size())
            .map_err(|_| CollectiveError::Mpi(format!("negative size {}", comm.size())))?;
        Ok(MpiGroup {
            engine: Engine::new(
                MpiLink {
                    comm: SendComm::new(comm),
                    rank,
                    size,
                    recv_buf: None,
                },
                timeout,
            ),
        })
    }
}

delegate_collective!(MpiGroup);

/// The thread that initialized MPI (set only when ckpt-zero did).
static INIT_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// Finalizes MPI (`MPI_Finalize`), if ckpt-zero initialized it and it is not finalized yet.
///
/// Collective over all processes: call it at the end of `main` on every rank, on the thread that
/// first called [`MpiGroup::world`], once no group is in use any more (background threads
/// joined). No MPI group may be used afterwards. Without it Open MPI's `mpirun` reports the
/// rank as terminated abnormally and exits non-zero.
pub fn finalize() -> Result<()> {
    let Some(init_thread) = INIT_THREAD.get() else {
        return Ok(()); // not initialized by ckpt-zero: the application owns MPI
    };
    if environment::is_finalized() {
        return Ok(());
    }
    if *init_thread != thread::current().id() {
        return Err(CollectiveError::InvalidArgument(
            "mpi::finalize must be called on the thread that initialized MPI".into(),
        ));
    }
    // SAFETY: MPI is initialized and not finalized, and this is the initializing thread.
    let code = unsafe { ::mpi::ffi::MPI_Finalize() };
    if code != 0 {
        return Err(CollectiveError::Mpi(format!(
            "MPI_Finalize failed with code {code}"
        )));
    }
    Ok(())
}

/// Initializes MPI once per process; later calls return the first outcome.
fn init() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        if environment::is_finalized() {
            return Err("MPI was already finalized".to_string());
        }
        let provided = match environment::initialize_with_threading(Threading::Multiple) {
            Some((universe, provided)) => {
                // Dropping the universe would finalize MPI while groups may still live on other
                // threads; `finalize` does it explicitly instead.
                std::mem::forget(universe);
                let _ = INIT_THREAD.set(thread::current().id());
                provided
            }
            // Already initialized by the application.
            None => environment::threading_support(),
        };
        if provided != Threading::Multiple {
            return Err(format!(
                "MPI provides thread level {provided:?}, ckpt-zero needs Multiple"
            ));
        }
        install_abort_on_panic();
        Ok(())
    })
    .clone()
    .map_err(CollectiveError::Mpi)
}

/// Chains a panic hook that aborts the MPI job after the previous hook has reported the panic
/// (unless the thread catches it, see [`crate::caught`]).
fn install_abort_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        // A panic the thread turns into an error (the memory tier's part) is not fatal.
        if crate::caught::catching() {
            return;
        }
        if environment::is_initialized() && !environment::is_finalized() {
            eprintln!("ckpt-zero: a thread panicked on an MPI rank; calling MPI_Abort");
            // SAFETY: MPI is initialized and not finalized; MPI_Abort may be called from any
            // thread under MPI_THREAD_MULTIPLE, and RSMPI_COMM_WORLD is a constant handle.
            unsafe {
                ::mpi::ffi::MPI_Abort(::mpi::ffi::RSMPI_COMM_WORLD, 101);
            }
        }
    }));
}

/// A communicator that may be moved to another thread. Freed on drop unless MPI was already
/// finalized (freeing it then would be an MPI error).
struct SendComm(ManuallyDrop<SimpleCommunicator>);

impl SendComm {
    fn new(comm: SimpleCommunicator) -> Self {
        SendComm(ManuallyDrop::new(comm))
    }
}

impl Drop for SendComm {
    fn drop(&mut self) {
        if !environment::is_finalized() {
            // SAFETY: dropped exactly once, here; never used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.0) };
        }
    }
}

// SAFETY: `SimpleCommunicator` is `!Send` only because it wraps a raw MPI handle (a pointer in
// Open MPI). MPI handles are process-wide and valid on any thread once MPI runs with
// `MPI_THREAD_MULTIPLE`, which `init` requires. The communicator is owned by exactly one group
// and used through `&mut` only, so it is used by one thread at a time.
unsafe impl Send for SendComm {}

struct MpiLink {
    comm: SendComm,
    rank: usize,
    size: usize,
    /// Reusable receive buffer (leaked allocation, see `leak_buf`); `None` while lent to MPI.
    recv_buf: Option<&'static mut [u8]>,
}

/// A heap buffer with `'static` lifetime, as rsmpi's `StaticScope` requires. Reclaimed with
/// `unleak_buf` once MPI no longer uses it; leaked for good if a request is abandoned (after a
/// timeout), so MPI can never touch freed memory.
fn leak_buf(data: Vec<u8>) -> &'static mut [u8] {
    Box::leak(data.into_boxed_slice())
}

/// # Safety
/// `buf` must come from `leak_buf`, and no request or other reference may still use it.
unsafe fn unleak_buf(buf: *mut [u8]) {
    // SAFETY: per the contract, `buf` is a leaked `Box<[u8]>` that nothing references.
    drop(unsafe { Box::from_raw(buf) });
}

/// Sleeps between polls, backing off from 10 µs to `MAX_POLL_SLEEP`.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Backoff(Duration::from_micros(10))
    }
    fn sleep(&mut self) {
        thread::sleep(self.0);
        self.0 = (self.0 * 2).min(MAX_POLL_SLEEP);
    }
}

impl MpiLink {
    fn mpi_rank(&self, peer: usize) -> std::result::Result<i32, LinkError> {
        i32::try_from(peer)
            .ok()
            .filter(|_| peer < self.size)
            .ok_or_else(|| LinkError::Backend(format!("rank {peer} is not in the group")))
    }
}

impl Link for MpiLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(
        &mut self,
        dst: usize,
        frame: Frame,
        deadline: Instant,
    ) -> std::result::Result<(), LinkError> {
        let dst = self.mpi_rank(dst)?;
        let buf: &'static [u8] = leak_buf(frame.encode());
        let ptr = buf as *const [u8] as *mut [u8];
        let mut request =
            self.comm
                .0
                .process_at_rank(dst)
                .immediate_send_with_tag(StaticScope, buf, TAG);
        let mut backoff = Backoff::new();
        loop {
            match request.test() {
                Ok(_status) => {
                    // SAFETY: the send completed, so MPI no longer reads `buf`, and the request
                    // (the only other reference) was consumed by `test`.
                    unsafe { unleak_buf(ptr) };
                    return Ok(());
                }
                Err(pending) => request = pending,
            }
            if Instant::now() >= deadline {
                // Abandon the send: sends cannot be reliably cancelled, so keep its buffer
                // alive forever (leaked) and forget the request handle without panicking.
                // SAFETY: into_raw only disarms the request's drop check; the buffer stays valid.
                let _ = unsafe { request.into_raw() };
                return Err(LinkError::Timeout);
            }
            backoff.sleep();
        }
    }

    fn recv(&mut self, src: usize, deadline: Instant) -> std::result::Result<Frame, LinkError> {
        let src = self.mpi_rank(src)?;
        let buf = match self.recv_buf.take() {
            Some(buf) => buf,
            None => leak_buf(vec![0u8; HEADER_LEN + CHUNK_SIZE]),
        };
        let ptr: *mut [u8] = buf;
        let mut request = self
            .comm
            .0
            .process_at_rank(src)
            .immediate_receive_into_with_tag(StaticScope, buf, TAG);
        let mut backoff = Backoff::new();
        let mut cancel_deadline = None;
        loop {
            match request.test() {
                Ok(status) => {
                    // SAFETY: the receive completed and `test` consumed the request, so this is
                    // again the only reference to the leaked buffer.
                    let buf: &'static mut [u8] = unsafe { &mut *ptr };
                    if cancel_deadline.is_some() {
                        self.recv_buf = Some(buf);
                        return Err(LinkError::Timeout);
                    }
                    let count = usize::try_from(status.count(u8::equivalent_datatype()))
                        .unwrap_or(usize::MAX);
                    let frame = buf.get(..count).and_then(Frame::decode);
                    self.recv_buf = Some(buf);
                    return frame.ok_or_else(|| {
                        LinkError::Backend(format!(
                            "malformed frame of {count} bytes from rank {src}"
                        ))
                    });
                }
                Err(pending) => request = pending,
            }
            let now = Instant::now();
            match cancel_deadline {
                None if now >= deadline => {
                    // A posted receive would steal a later frame: cancel it and wait (briefly)
                    // for the cancellation to complete before reusing the buffer.
                    request.cancel();
                    cancel_deadline = Some(now + Duration::from_secs(1));
                }
                Some(limit) if now >= limit => {
                    // SAFETY: the buffer stays leaked, so MPI may still write into it safely.
                    let _ = unsafe { request.into_raw() };
                    return Err(LinkError::Timeout);
                }
                _ => {}
            }
            backoff.sleep();
        }
    }

    fn notify(&mut self, dst: usize, frame: Frame) {
        let deadline = Instant::now() + NOTIFY_WAIT;
        // Best effort: a peer that does not take it in time will time out by itself.
        if let Err(LinkError::Timeout | LinkError::Gone | LinkError::Backend(_)) =
            self.send(dst, frame, deadline)
        {}
    }

    fn split(&mut self, timeout: Duration) -> Result<Box<dyn Collective>> {
        let comm = self.comm.0.duplicate();
        Ok(Box::new(MpiGroup::from_comm(comm, timeout)?))
    }
}
