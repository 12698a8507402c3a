//! Measurement kernels shared by the criterion benches (`benches/stall.rs`,
//! `benches/persist.rs`) and the performance report (`examples/bench_report/`), so both
//! measure exactly the same thing. Each kernel performs one operation and returns the time of
//! the part that counts; setup and clean-up around it are untimed.
//!
//! - Stall per save ([`TrainState`]): our async path ([`TrainState::save_async`]: handle-clone
//!   capture + [`Engine::submit`]), our blocking path ([`TrainState::save_sync`]), what Burn's
//!   built-in checkpointer does on the training thread ([`TrainState::save_burn`]), the cost of
//!   cloning the handles alone ([`TrainState::clone_handles`]) and the physical floor of an
//!   eager host copy of the same bytes ([`MemcpyFloor`]).
//! - Persist: the engine ([`engine_persist`]) beside a plain `write` + `fsync` of the same
//!   bytes to the same filesystem ([`write_fsync_floor`]).
//! - Restore ([`restore_time`]) beside reading the same files ([`read_floor`]), and reading
//!   them with verification only ([`verified_read_time`]).
//! - Memory: the process's resident set and its high-water mark from `/proc/self/status`
//!   ([`proc_status_bytes`], [`reset_peak_rss`]; Linux only, `None`/`false` elsewhere).
//!
//! State sizes are model + AdamW (two moments) = 12 bytes per parameter of a
//! [`crate::model::Mlp`]; [`STATE_SIZES`] lists the ones the benches use.

use std::{
    fs,
    io::Write,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::store::ModuleRecord;
use burn::tensor::{Device, Distribution, Tensor};
use burn::train::checkpoint::{AsyncCheckpointer, Checkpointer, FileCheckpointer};
use ckpt_core::{Engine, SaveEvent, Snapshot, snapshot::PartData};

use crate::model::{INPUT_DIM, Mlp, optimizer, scheduler};
use ckpt_burn::{DataCursor, FrozenState, TrainerState, restore};
use ckpt_core::SaveRoute;

use crate::{Error, Result};

/// A benchmark state size: an [`Mlp`] of `layers` hidden layers of width `hidden`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSize {
    /// Name used on the command line and in reports (`10mb`, `100mb`, `1gb`, `4gb`).
    pub label: &'static str,
    /// Hidden width.
    pub hidden: usize,
    /// Hidden layers.
    pub layers: usize,
}

impl StateSize {
    /// The size named `label` in [`STATE_SIZES`] (case-insensitive).
    pub fn by_label(label: &str) -> Option<Self> {
        STATE_SIZES
            .iter()
            .copied()
            .find(|s| s.label.eq_ignore_ascii_case(label.trim()))
    }

    /// Parameters of the model.
    pub fn params(&self) -> usize {
        let (h, l) = (self.hidden, self.layers.max(1));
        (INPUT_DIM * h + h) + (l - 1) * (h * h + h) + (h + 1)
    }

    /// Bytes of model + AdamW state (12 per parameter).
    pub fn state_bytes(&self) -> usize {
        self.params() * 12
    }
}

/// The sizes the stall benchmark knows: about 10 MB, 100 MB, 1 GB and 4 GB of model + AdamW.
pub const STATE_SIZES: [StateSize; 4] = [
    StateSize {
        label: "10mb",
        hidden: 512,
        layers: 4,
    },
    StateSize {
        label: "100mb",
        hidden: 1024,
        layers: 9,
    },
    StateSize {
        label: "1gb",
        hidden: 4096,
        layers: 6,
    },
    StateSize {
        label: "4gb",
        hidden: 8192,
        layers: 6,
    },
];

fn burn_err(root: &Path, e: burn::train::checkpoint::CheckpointerError) -> Error {
    Error::Burn(ckpt_burn::Error::Record {
        path: root.to_path_buf(),
        reason: e.to_string(),
    })
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Burn(ckpt_burn::Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A model, AdamW optimizer and cosine LR scheduler on Flex (autodiff), as the example trainer
/// builds them, with its optimizer moments already created.
pub struct TrainState {
    /// The device (Flex, autodiff).
    pub device: Device,
    /// The model.
    pub model: Mlp,
    /// AdamW ([`crate::model::optimizer`]).
    pub optim: ModuleOptimizer,
    /// Cosine schedule ([`crate::model::scheduler`]).
    pub sched: ModuleLrScheduler,
    /// Steps taken.
    pub step: u64,
}

impl std::fmt::Debug for TrainState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainState")
            .field("step", &self.step)
            .field("state_bytes", &self.state_bytes())
            .finish()
    }
}

impl TrainState {
    /// A seeded state of `size`, after one training step (so the AdamW moments exist).
    pub fn new(size: StateSize) -> Result<Self> {
        let device = Device::flex().autodiff();
        device.seed(1);
        let model = Mlp::new(size.hidden, size.layers, 0.1, &device);
        let mut s = Self {
            device,
            model,
            optim: optimizer(),
            sched: scheduler(1e-3)?,
            step: 0,
        };
        s.train_step();
        Ok(s)
    }

    /// One training step on a random batch of 8: forward, backward, scheduler, AdamW.
    pub fn train_step(&mut self) {
        let x = Tensor::<2>::random([8, INPUT_DIM], Distribution::Default, &self.device);
        let y = Tensor::<2>::random([8, 1], Distribution::Default, &self.device);
        let loss = MseLoss::new().forward(self.model.forward(x), y, Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &self.model);
        let lr = self.sched.step();
        self.model = self.optim.step(lr, self.model.clone(), grads);
        self.step += 1;
    }

    /// The trainer state written with a checkpoint of this step.
    pub fn trainer(&self) -> TrainerState {
        TrainerState::new(self.step, DataCursor::default(), 1)
    }

    /// Bytes of model + optimizer state (what every save writes, minus small files).
    pub fn state_bytes(&self) -> usize {
        self.model.num_params() * 12
    }

    /// Our async path: capture (handle clones) + submit, as the library's own save path
    /// ([`FrozenState::submit`]) does without a memory budget: the optimizer record written
    /// through a scratch file. Returns the training-thread stall; the persist keeps running
    /// in the background (collect it with [`Engine::wait_idle`]).
    pub fn save_async(&self, engine: &mut Engine) -> Result<Duration> {
        Ok(self.save_async_parts(engine)?.total())
    }

    /// [`Self::save_async`] with the stall split into its three parts.
    pub fn save_async_parts(&self, engine: &mut Engine) -> Result<AsyncStall> {
        let t0 = Instant::now();
        let frozen = FrozenState::capture(&self.model, &self.optim, &self.sched, self.trainer());
        let t1 = Instant::now();
        let snapshot = frozen.with_scratch_dir(engine.root()).into_snapshot();
        let t2 = Instant::now();
        engine.submit(snapshot)?;
        let t3 = Instant::now();
        Ok(AsyncStall {
            capture: t1 - t0,
            snapshot: t2 - t1,
            submit: t3 - t2,
        })
    }

    /// A save within a memory budget of `budget` bytes, through the library's own save path
    /// ([`FrozenState::submit`], what the trainer, the learner strategy and
    /// `CheckpointManager` call): in the background when its peak fits
    /// ([`ckpt_core::MemoryGate::route`]), else submitted and waited for until what it still
    /// holds fits the budget, as [`ckpt_core::CheckpointSession::save`] waits. Returns the
    /// stall and the route taken.
    pub fn save_within(&self, engine: &mut Engine, budget: u64) -> Result<(Duration, SaveRoute)> {
        let t0 = Instant::now();
        let frozen = FrozenState::capture(&self.model, &self.optim, &self.sched, self.trainer());
        let mut gate = ckpt_core::MemoryGate::new(Some(budget));
        let route = frozen.submit(engine, &mut gate, |s| s)?.route;
        match route {
            SaveRoute::Blocking => drop(engine.wait_idle()?),
            SaveRoute::Throttled => {
                engine.wait_held_at_most(gate.wait_limit().unwrap_or(budget))?;
            }
            SaveRoute::Background => {}
        }
        Ok((t0.elapsed(), route))
    }

    /// Our blocking path: the same bytes, encoded on this thread, written, fsynced and
    /// published before returning. Returns the stall (all of it) and the published event.
    pub fn save_sync(&self, engine: &mut Engine) -> Result<(Duration, Vec<SaveEvent>)> {
        let start = Instant::now();
        let frozen = FrozenState::capture(&self.model, &self.optim, &self.sched, self.trainer());
        engine.submit(frozen.encode()?.into_snapshot())?;
        let events = engine.wait_idle()?;
        Ok((start.elapsed(), events))
    }

    /// What Burn's built-in checkpointer (`with_default_checkpointers`) does on the training
    /// thread at a save: `model.clone().into_record()`, `optim.to_record()` and
    /// `sched.to_record()`, each handed to an `AsyncCheckpointer<FileCheckpointer>` writing
    /// under `root`. Only those calls are timed; dropping the checkpointers afterwards joins
    /// their writer threads (untimed, as the next save would wait behind them), then `root` is
    /// removed.
    pub fn save_burn(&self, root: &Path) -> Result<Duration> {
        let model_ck: AsyncCheckpointer<ModuleRecord> =
            AsyncCheckpointer::new(FileCheckpointer::new(root, "model"));
        let optim_ck: AsyncCheckpointer<burn::optim::OptimizerRecord> =
            AsyncCheckpointer::new(FileCheckpointer::new(root, "optim"));
        let sched_ck: AsyncCheckpointer<burn::optim::lr_scheduler::LrSchedulerRecord> =
            AsyncCheckpointer::new(FileCheckpointer::new(root, "scheduler"));
        let e = self.step as usize;
        let start = Instant::now();
        model_ck
            .save(e, self.model.clone().into_record())
            .map_err(|x| burn_err(root, x))?;
        optim_ck
            .save(e, self.optim.to_record())
            .map_err(|x| burn_err(root, x))?;
        sched_ck
            .save(e, self.sched.to_record())
            .map_err(|x| burn_err(root, x))?;
        let t = start.elapsed();
        drop((model_ck, optim_ck, sched_ck));
        let _ = fs::remove_dir_all(root);
        Ok(t)
    }

    /// Cloning the model and optimizer handles and taking the scheduler record: the least any
    /// copy-on-write snapshot costs ([`FrozenState::capture`]); dropped untimed.
    pub fn clone_handles(&self) -> Duration {
        let start = Instant::now();
        let frozen = FrozenState::capture(&self.model, &self.optim, &self.sched, self.trainer());
        let t = start.elapsed();
        drop(frozen);
        t
    }
}

/// The parts of an async save's stall on the training thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AsyncStall {
    /// [`FrozenState::capture`]: cloning the model and optimizer handles.
    pub capture: Duration,
    /// [`FrozenState::into_snapshot`]: boxing the part producers, encoding `trainer.bin`.
    pub snapshot: Duration,
    /// [`Engine::submit`]: checks, a free persist slot, handing the job to the persist thread.
    pub submit: Duration,
}

impl AsyncStall {
    /// The whole stall.
    pub fn total(&self) -> Duration {
        self.capture + self.snapshot + self.submit
    }
}

/// The physical floor of an eager snapshot: copying the same number of bytes into a
/// pre-faulted host buffer.
pub struct MemcpyFloor {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl std::fmt::Debug for MemcpyFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcpyFloor")
            .field("bytes", &self.src.len())
            .finish()
    }
}

impl MemcpyFloor {
    /// Source and destination buffers of `bytes`, both written once (pre-faulted).
    pub fn new(bytes: usize) -> Self {
        Self {
            src: vec![1u8; bytes],
            dst: vec![0u8; bytes],
        }
    }

    /// One copy of the whole buffer.
    pub fn copy(&mut self) -> Duration {
        let start = Instant::now();
        self.dst.copy_from_slice(std::hint::black_box(&self.src));
        std::hint::black_box(&self.dst);
        start.elapsed()
    }
}

/// `parts` buffers totalling `total` bytes of non-constant data, for persist measurements.
pub fn persist_parts(total: usize, parts: usize) -> Vec<Arc<[u8]>> {
    let n = parts.max(1);
    (0..n)
        .map(|i| {
            let v: Vec<u8> = (0..total / n)
                .map(|j| (j as u64 * 2654435761 + i as u64) as u8)
                .collect();
            Arc::from(v)
        })
        .collect()
}

/// The persist floor: writes each part to a new file in the new directory `dir` (8 MiB
/// writes), fsyncs every file, then fsyncs `dir`. Only that is timed; `dir` is removed after.
pub fn write_fsync_floor(dir: &Path, parts: &[Arc<[u8]>]) -> Result<Duration> {
    fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let start = Instant::now();
    for (i, p) in parts.iter().enumerate() {
        let path = dir.join(i.to_string());
        let mut f = fs::File::create(&path).map_err(|e| io_err(&path, e))?;
        for c in p.chunks(8 << 20) {
            f.write_all(c).map_err(|e| io_err(&path, e))?;
        }
        f.sync_all().map_err(|e| io_err(&path, e))?;
    }
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))?;
    let t = start.elapsed();
    fs::remove_dir_all(dir).map_err(|e| io_err(dir, e))?;
    Ok(t)
}

/// The engine's persist of the same parts as checkpoint `step`: submit to published (temporary
/// directory, checksums, fsyncs, manifest, rename, `latest`). Returns the time from submit to
/// published and the event. Open the engine with `Retention::keep_all()`: the previous
/// checkpoint (`step - 1`) is deleted here, after the timed region, as the floor deletes its
/// files.
pub fn engine_persist(
    engine: &mut Engine,
    step: u64,
    parts: &[Arc<[u8]>],
) -> Result<(Duration, SaveEvent)> {
    let mut s = Snapshot::new(step);
    for (i, p) in parts.iter().enumerate() {
        s = s.with_part(format!("part{i}.bin"), PartData::Shared(p.clone()));
    }
    let start = Instant::now();
    engine.submit(s)?;
    let events = engine.wait_idle()?;
    let t = start.elapsed();
    let ev = events
        .into_iter()
        .find(|e| e.step == step)
        .ok_or_else(|| Error::Config(format!("step {step} was not published")))?;
    if step > 0 {
        let prev = engine
            .root()
            .join(ckpt_core::layout::checkpoint_dir_name(step - 1));
        if prev.exists() {
            fs::remove_dir_all(&prev).map_err(|e| io_err(&prev, e))?;
        }
    }
    Ok((t, ev))
}

/// The restore floor: `std::fs::read` of every file in checkpoint `dir`, one after the other
/// on this thread. Returns the time and the bytes read. ([`restore`] reads the optimizer part
/// on a second thread, so on a machine with two or more cores it can beat this floor.)
pub fn read_floor(dir: &Path) -> Result<(Duration, u64)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .map_err(|e| io_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let start = Instant::now();
    let mut bytes = 0u64;
    for p in &files {
        let v = fs::read(p).map_err(|e| io_err(p, e))?;
        bytes += std::hint::black_box(v).len() as u64;
    }
    Ok((start.elapsed(), bytes))
}

/// Reading and verifying every file of checkpoint `dir` the way [`restore`] reads them (the
/// manifest, then each part read once into the buffer Burn will adopt, its size and XXH3
/// checked while it is read; the optimizer part on a second thread), without decoding: the
/// part of a restore that is not Burn's decoding and loading.
pub fn verified_read_time(dir: &Path) -> Result<Duration> {
    let start = Instant::now();
    std::hint::black_box(ckpt_burn::read_verified_parts(dir)?);
    Ok(start.elapsed())
}

/// [`restore`] of checkpoint `dir` into a fresh model of `size`, optimizer and scheduler
/// (built untimed): reads and verifies every part, decodes the records and loads them.
pub fn restore_time(dir: &Path, size: StateSize) -> Result<Duration> {
    let device = Device::flex().autodiff();
    let model = Mlp::new(size.hidden, size.layers, 0.1, &device);
    let (optim, sched) = (optimizer(), scheduler(1e-3)?);
    let start = Instant::now();
    let restored = restore(dir, model, optim, sched)?;
    let t = start.elapsed();
    drop(restored);
    Ok(t)
}

/// A `/proc/self/status` memory field (`VmRSS`, `VmHWM`, ...) in bytes; `None` where the
/// file or the field is missing (not Linux).
pub fn proc_status_bytes(field: &str) -> Option<u64> {
    kib_field("/proc/self/status", field)
}

/// A memory field (`VmRSS`, ...) of `/proc/<pid>/status` in bytes; `None` where the process
/// is gone or the field is missing.
fn pid_status_bytes(pid: u32, field: &str) -> Option<u64> {
    kib_field(&format!("/proc/{pid}/status"), field)
}

/// The machine's tmpfs and shared memory in use (`Shmem` of `/proc/meminfo`), in bytes.
fn shmem_bytes() -> Option<u64> {
    kib_field("/proc/meminfo", "Shmem")
}

/// The `field: N kB` line of a `/proc` file, in bytes.
fn kib_field(path: &str, field: &str) -> Option<u64> {
    let s = fs::read_to_string(path).ok()?;
    s.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    })
}

/// Samples a process's memory as the machine pays for it: its resident set plus what tmpfs
/// gained since the sampler started (`Shmem`, where a save's scratch files go when
/// `/dev/shm` has room: memory that no process's RSS shows). Every 5 ms on its own thread,
/// until [`Self::stop`], which returns the peak of the sum. Other processes' tmpfs use
/// counts too, so measure on a quiet machine.
#[derive(Debug)]
pub struct MemorySampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl MemorySampler {
    /// Starts sampling process `pid` (this process: [`std::process::id`]).
    pub fn start(pid: u32) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let shm0 = shmem_bytes().unwrap_or(0);
        let thread = std::thread::Builder::new()
            .name("mem-sampler".into())
            .spawn(move || {
                let mut peak = 0;
                loop {
                    if let Some(rss) = pid_status_bytes(pid, "VmRSS") {
                        let shm = shmem_bytes().unwrap_or(shm0).saturating_sub(shm0);
                        peak = u64::max(peak, rss + shm);
                    }
                    if flag.load(std::sync::atomic::Ordering::Relaxed) {
                        return peak;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
            .ok();
        Self { stop, thread }
    }

    /// Stops sampling: the peak of resident set + tmpfs growth seen, in bytes (0 where
    /// nothing could be read, or the sampler thread could not start).
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

/// Resets the process's resident-set high-water mark (`VmHWM`) to the current resident set
/// (writes `5` to `/proc/self/clear_refs`, Linux 4.0+). `false` if that is not possible; then
/// `VmHWM` stays the peak since the process started.
pub fn reset_peak_rss() -> bool {
    fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_sees_this_process_and_the_machines_tmpfs() {
        assert!(proc_status_bytes("VmRSS").is_some_and(|b| b > 0));
        assert!(pid_status_bytes(std::process::id(), "VmRSS").is_some_and(|b| b > 0));
        // `ShmemHugePages:` must not be read as `Shmem:`.
        assert!(shmem_bytes().is_some());
        let sampler = MemorySampler::start(std::process::id());
        std::thread::sleep(Duration::from_millis(20));
        assert!(sampler.stop() > 0);
    }
}
