//! A simulated disk with a page cache that a power cut empties: [`SimDisk`] implements
//! [`ckpt_core::Storage`] in memory, records a crash point after every storage operation, and
//! turns each crash point into the disks a power cut at that moment may leave
//! ([`CrashPoint::images`]).
//!
//! # The model
//! Written for the power-loss test, after SQLite's crash-test VFS and ALICE's abstract
//! persistence model, and deliberately weaker than any real journaling file system:
//!
//! - **File data** is volatile until the file's `sync`. A cut keeps the synced data plus any
//!   prefix of what was appended since (all, none or half of it), optionally with its last
//!   512-byte block torn (garbage).
//! - **Names** (create, mkdir, rename, exchange, unlink, rmdir) are volatile until the
//!   `sync_dir` of their directory. A name's file data and its directory entry are independent:
//!   a synced directory may name a file whose data was never synced.
//! - **Ordering**: a directory's name operations become durable in the order they were made (a
//!   journal commits them in order), each directory independently of the others. A cut keeps,
//!   for every directory, a prefix of its pending operations; an operation touching two
//!   directories (a rename between them) is kept in both or in neither, and atomically.
//! - `sync_dir(d)` makes durable every pending operation on `d` and, to keep each directory's
//!   order, every earlier pending operation on the other directories those touch.
//!
//! Locks are in memory and do not survive a cut, like `flock`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::{Hash, Hasher},
    io::{self, Cursor, Read, Write},
    path::{Component, Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use ckpt_core::storage::{
    DirEntry, EntryMeta, LockAttempt, LockGuard, ReadFile, Storage, WriteFile,
};

type Ino = u64;

/// The inode of `/`.
const ROOT: Ino = 0;

#[derive(Debug, Clone)]
enum Node {
    File {
        data: Vec<u8>,
        synced: Vec<u8>,
    },
    Dir {
        live: BTreeMap<String, Ino>,
        durable: BTreeMap<String, Ino>,
    },
}

/// One pending name operation: its effect on each directory it touches, applied in order.
#[derive(Debug, Clone)]
struct NameOp {
    effects: Vec<(Ino, String, Option<Ino>)>,
}

impl NameOp {
    fn dirs(&self) -> BTreeSet<Ino> {
        self.effects.iter().map(|(d, _, _)| *d).collect()
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    nodes: HashMap<Ino, Node>,
    next: Ino,
    pending: Vec<NameOp>,
}

/// A moment at which power may be cut: the state right after one storage operation.
#[derive(Debug, Clone)]
pub struct CrashPoint {
    /// How many storage operations had completed (1-based index of the last one).
    pub after_op: u64,
    /// The last operation, for messages (`rename /ckpt/.tmp-3-... -> /ckpt/step-00000003`).
    pub op: String,
    state: State,
}

#[derive(Debug, Default)]
struct Sim {
    state: State,
    ops: u64,
    record: bool,
    points: Vec<CrashPoint>,
    locks: BTreeMap<PathBuf, String>,
}

/// An in-memory disk whose unsynced data and names a simulated power cut may lose. Cheap to
/// clone (the clones share one disk).
#[derive(Debug, Clone)]
pub struct SimDisk(Arc<Mutex<Sim>>);

impl Default for SimDisk {
    fn default() -> Self {
        Self::new()
    }
}

fn not_found(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: not found", p.display()),
    )
}

fn exists_err(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("{}: exists", p.display()),
    )
}

fn names(p: &Path) -> io::Result<Vec<String>> {
    let mut v = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(s) => v.push(s.to_string_lossy().into_owned()),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: only absolute, normalized paths", p.display()),
                ));
            }
        }
    }
    Ok(v)
}

impl State {
    fn fresh() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node::Dir {
                live: BTreeMap::new(),
                durable: BTreeMap::new(),
            },
        );
        Self {
            nodes,
            next: ROOT + 1,
            pending: Vec::new(),
        }
    }

    fn lookup(&self, p: &Path) -> io::Result<Ino> {
        let mut ino = ROOT;
        for n in names(p)? {
            match self.nodes.get(&ino) {
                Some(Node::Dir { live, .. }) => {
                    ino = *live.get(&n).ok_or_else(|| not_found(p))?;
                }
                _ => return Err(not_found(p)),
            }
        }
        Ok(ino)
    }

    /// The parent directory's inode and the last name of `p`.
    fn parent(&self, p: &Path) -> io::Result<(Ino, String)> {
        let mut n = names(p)?;
        let last = n
            .pop()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the root has no parent"))?;
        let parent: PathBuf = std::iter::once("/".to_string()).chain(n).collect();
        let d = self.lookup(&parent)?;
        match self.nodes.get(&d) {
            Some(Node::Dir { .. }) => Ok((d, last)),
            _ => Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{}: parent is not a directory", p.display()),
            )),
        }
    }

    fn live(&mut self, d: Ino) -> &mut BTreeMap<String, Ino> {
        match self.nodes.get_mut(&d) {
            Some(Node::Dir { live, .. }) => live,
            _ => unreachable!("directory inode {d} is a directory"),
        }
    }

    fn entry(&self, d: Ino, name: &str) -> Option<Ino> {
        match self.nodes.get(&d) {
            Some(Node::Dir { live, .. }) => live.get(name).copied(),
            _ => None,
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.nodes.get(&ino), Some(Node::Dir { .. }))
    }

    /// Applies a name operation to the live tree and logs it as pending.
    fn name_op(&mut self, effects: Vec<(Ino, String, Option<Ino>)>) {
        for (d, name, target) in &effects {
            match target {
                Some(t) => {
                    self.live(*d).insert(name.clone(), *t);
                }
                None => {
                    self.live(*d).remove(name);
                }
            }
        }
        self.pending.push(NameOp { effects });
    }

    fn alloc(&mut self, node: Node) -> Ino {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, node);
        ino
    }

    /// Makes the pending operations on `d` durable, with the earlier ones their directories
    /// need to stay in order.
    fn sync_dir(&mut self, d: Ino) {
        // Walk back from the newest op: an op is needed if it touches `d`, or if a needed
        // later op touches one of its directories (that directory's order must hold).
        let mut bound: HashMap<Ino, usize> = HashMap::new();
        let mut needed = vec![false; self.pending.len()];
        for (i, op) in self.pending.iter().enumerate().rev() {
            let ds = op.dirs();
            if ds.contains(&d) || ds.iter().any(|x| bound.get(x).is_some_and(|b| i < *b)) {
                needed[i] = true;
                for x in ds {
                    let b = bound.entry(x).or_insert(i);
                    *b = (*b).max(i);
                }
            }
        }
        let pending = std::mem::take(&mut self.pending);
        for (op, n) in pending.into_iter().zip(needed) {
            if n {
                apply_durable(&mut self.nodes, &op);
            } else {
                self.pending.push(op);
            }
        }
    }
}

fn apply_durable(nodes: &mut HashMap<Ino, Node>, op: &NameOp) {
    for (d, name, target) in &op.effects {
        if let Some(Node::Dir { durable, .. }) = nodes.get_mut(d) {
            match target {
                Some(t) => {
                    durable.insert(name.clone(), *t);
                }
                None => {
                    durable.remove(name);
                }
            }
        }
    }
}

impl SimDisk {
    /// An empty disk holding only `/`.
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(Sim {
            state: State::fresh(),
            ..Default::default()
        })))
    }

    fn sim(&self) -> MutexGuard<'_, Sim> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts recording a crash point after every storage operation.
    pub fn record(&self) {
        self.sim().record = true;
    }

    /// The crash points recorded so far.
    pub fn take_points(&self) -> Vec<CrashPoint> {
        std::mem::take(&mut self.sim().points)
    }

    /// Storage operations completed so far.
    pub fn ops(&self) -> u64 {
        self.sim().ops
    }

    /// Runs one storage operation, then counts it and records a crash point.
    fn op<T>(&self, what: impl FnOnce() -> String, f: impl FnOnce(&mut State) -> T) -> T {
        let mut sim = self.sim();
        let out = f(&mut sim.state);
        sim.ops += 1;
        if sim.record {
            let point = CrashPoint {
                after_op: sim.ops,
                op: what(),
                state: sim.state.clone(),
            };
            sim.points.push(point);
        }
        out
    }

    /// Every path of the live tree with its contents (`None` for directories), sorted; for
    /// messages and comparisons.
    pub fn tree(&self) -> Vec<(PathBuf, Option<Vec<u8>>)> {
        let sim = self.sim();
        let mut out = Vec::new();
        walk(
            &sim.state.nodes,
            ROOT,
            PathBuf::from("/"),
            &mut out,
            |n| match n {
                Node::Dir { live, .. } => live.clone(),
                Node::File { .. } => BTreeMap::new(),
            },
        );
        out
    }
}

fn walk(
    nodes: &HashMap<Ino, Node>,
    ino: Ino,
    path: PathBuf,
    out: &mut Vec<(PathBuf, Option<Vec<u8>>)>,
    children: impl Fn(&Node) -> BTreeMap<String, Ino> + Copy,
) {
    let Some(node) = nodes.get(&ino) else { return };
    match node {
        Node::File { data, .. } => out.push((path, Some(data.clone()))),
        Node::Dir { .. } => {
            out.push((path.clone(), None));
            for (name, child) in children(node) {
                walk(nodes, child, path.join(name), out, children);
            }
        }
    }
}

/// How a cut treats file data appended since the last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataFate {
    Lost,
    Kept,
    Half,
    TornTail,
}

impl CrashPoint {
    /// Up to `max` distinct disks a power cut at this point may leave, each with a label
    /// saying which pending operations and data survived. Always tried: nothing volatile
    /// survives; everything survives; every prefix of the pending name operations; each
    /// directory's pending operations all-or-nothing; then seeded random per-directory
    /// prefixes. Each is combined with a fate of the unsynced file data (lost, kept, half,
    /// torn last block).
    pub fn images(&self, max: usize, seed: u64) -> Vec<(String, SimDisk)> {
        let n = self.state.pending.len();
        let mut dirs: Vec<Ino> = self
            .state
            .pending
            .iter()
            .flat_map(|op| op.dirs())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        dirs.sort();
        let mut prefixes = Vec::new();
        for k in 1..n {
            prefixes.push((
                format!("first {k} of {n} pending name ops"),
                prefix_set(n, k),
            ));
        }
        let mut masks = Vec::new();
        if dirs.len() <= 6 {
            for mask in 1u32..(1 << dirs.len()) - 1 {
                let cuts: HashMap<Ino, usize> = dirs
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (*d, if mask & (1 << i) != 0 { usize::MAX } else { 0 }))
                    .collect();
                masks.push((
                    format!("pending ops of directories {mask:b} (of inodes {dirs:?}) only"),
                    self.per_dir(&cuts),
                ));
            }
        }
        let mut random = Vec::new();
        let mut rng = seed ^ self.after_op.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for r in 0..8 {
            let cuts: HashMap<Ino, usize> = dirs
                .iter()
                .map(|d| (*d, (xorshift(&mut rng) % (n as u64 + 1)) as usize))
                .collect();
            random.push((
                format!("random per-directory prefixes #{r}"),
                self.per_dir(&cuts),
            ));
        }
        // The extremes first, then the three kinds of partial cut taken in turn, so that a
        // small `max` still sees each kind.
        let mut choices: Vec<(String, Vec<bool>)> = vec![
            ("no pending name op".into(), vec![false; n]),
            ("every pending name op".into(), vec![true; n]),
        ];
        let mut kinds = [prefixes.into_iter(), masks.into_iter(), random.into_iter()];
        loop {
            let before = choices.len();
            for k in &mut kinds {
                choices.extend(k.next());
            }
            if choices.len() == before {
                break;
            }
        }
        let fates = [
            DataFate::Lost,
            DataFate::Kept,
            DataFate::TornTail,
            DataFate::Half,
        ];
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        'outer: for (i, (label, keep)) in choices.iter().enumerate() {
            // Cycle the data fates over the name choices, and try every fate on the two
            // extremes, so that both dimensions are covered without a full product.
            let fs: Vec<DataFate> = if i < 2 {
                fates.to_vec()
            } else {
                vec![fates[i % fates.len()], fates[(i + 1) % fates.len()]]
            };
            for fate in fs {
                let disk = self.image(keep, fate);
                if seen.insert(disk.fingerprint()) {
                    out.push((format!("{label}, unsynced data {fate:?}"), disk));
                    if out.len() >= max {
                        break 'outer;
                    }
                }
            }
        }
        out
    }

    /// The largest per-directory-prefix-closed set of pending ops with at most `cuts[d]` ops
    /// of each directory `d`.
    fn per_dir(&self, cuts: &HashMap<Ino, usize>) -> Vec<bool> {
        let mut taken: HashMap<Ino, usize> = HashMap::new();
        let mut closed: BTreeSet<Ino> = BTreeSet::new();
        let mut keep = Vec::with_capacity(self.state.pending.len());
        for op in &self.state.pending {
            let ds = op.dirs();
            let ok = ds
                .iter()
                .all(|d| !closed.contains(d) && taken.get(d).copied().unwrap_or(0) < cuts[d]);
            if ok {
                for d in &ds {
                    *taken.entry(*d).or_default() += 1;
                }
            } else {
                closed.extend(ds);
            }
            keep.push(ok);
        }
        keep
    }

    /// The disk after a cut that keeps the durable state, the pending name ops marked in
    /// `keep`, and unsynced data according to `fate`. Everything on it is durable.
    fn image(&self, keep: &[bool], fate: DataFate) -> SimDisk {
        let mut nodes = self.state.nodes.clone();
        for (op, k) in self.state.pending.iter().zip(keep) {
            if *k {
                apply_durable(&mut nodes, op);
            }
        }
        for node in nodes.values_mut() {
            match node {
                Node::File { data, synced } => {
                    let base = if data.starts_with(synced) {
                        synced.len()
                    } else {
                        0
                    };
                    let extra = data.len() - base;
                    let kept = match fate {
                        DataFate::Lost => base,
                        DataFate::Kept | DataFate::TornTail => data.len(),
                        DataFate::Half => base + extra / 2,
                    };
                    let mut now = if extra == 0 {
                        synced.clone()
                    } else {
                        data[..kept].to_vec()
                    };
                    if fate == DataFate::TornTail && extra > 0 {
                        let from = now.len().saturating_sub(512).max(base);
                        for b in &mut now[from..] {
                            *b = !*b;
                        }
                    }
                    *data = now.clone();
                    *synced = now;
                }
                Node::Dir { live, durable } => *live = durable.clone(),
            }
        }
        SimDisk(Arc::new(Mutex::new(Sim {
            state: State {
                nodes,
                next: self.state.next,
                pending: Vec::new(),
            },
            ..Default::default()
        })))
    }
}

impl SimDisk {
    /// A hash of the live tree (paths and contents), to count distinct disks.
    fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.tree().hash(&mut h);
        h.finish()
    }
}

fn prefix_set(n: usize, k: usize) -> Vec<bool> {
    (0..n).map(|i| i < k).collect()
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A file being written on a [`SimDisk`].
struct SimWriteFile {
    disk: SimDisk,
    ino: Ino,
    path: PathBuf,
}

impl Write for SimWriteFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let ino = self.ino;
        self.disk.op(
            || format!("write {} bytes to {}", buf.len(), self.path.display()),
            |st| match st.nodes.get_mut(&ino) {
                Some(Node::File { data, .. }) => {
                    data.extend_from_slice(buf);
                    Ok(buf.len())
                }
                _ => Err(not_found(&self.path)),
            },
        )
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl WriteFile for SimWriteFile {
    fn sync(&mut self) -> io::Result<()> {
        let ino = self.ino;
        self.disk.op(
            || format!("fsync {}", self.path.display()),
            |st| match st.nodes.get_mut(&ino) {
                Some(Node::File { data, synced }) => {
                    *synced = data.clone();
                    Ok(())
                }
                _ => Err(not_found(&self.path)),
            },
        )
    }
}

struct SimReadFile(Cursor<Vec<u8>>);

impl Read for SimReadFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl ReadFile for SimReadFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.get_ref().len() as u64)
    }
}

/// A held in-memory lock of a [`SimDisk`].
#[derive(Debug)]
struct SimLock {
    disk: SimDisk,
    path: PathBuf,
}

impl LockGuard for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.disk.sim().locks.remove(&self.path);
    }
}

fn remove_tree(st: &mut State, d: Ino, effects: &mut Vec<NameOp>) {
    let children: Vec<(String, Ino)> = match st.nodes.get(&d) {
        Some(Node::Dir { live, .. }) => live.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        _ => return,
    };
    for (name, child) in children {
        if st.is_dir(child) {
            remove_tree(st, child, effects);
        }
        st.live(d).remove(&name);
        effects.push(NameOp {
            effects: vec![(d, name, None)],
        });
    }
}

impl Storage for SimDisk {
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.op(
            || format!("mkdir {}", path.display()),
            |st| {
                let (d, name) = st.parent(path)?;
                if st.entry(d, &name).is_some() {
                    return Err(exists_err(path));
                }
                let ino = st.alloc(Node::Dir {
                    live: BTreeMap::new(),
                    durable: BTreeMap::new(),
                });
                st.name_op(vec![(d, name, Some(ino))]);
                Ok(())
            },
        )
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut cur = PathBuf::from("/");
        for n in names(path)? {
            cur.push(n);
            let exists = self.sim().state.lookup(&cur).ok();
            match exists {
                Some(ino) if self.sim().state.is_dir(ino) => {}
                Some(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotADirectory,
                        format!("{}: not a directory", cur.display()),
                    ));
                }
                None => self.create_dir(&cur)?,
            }
        }
        Ok(())
    }

    fn create_file(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let ino = self.op(
            || format!("create {}", path.display()),
            |st| {
                let (d, name) = st.parent(path)?;
                if st.entry(d, &name).is_some() {
                    return Err(exists_err(path));
                }
                let ino = st.alloc(Node::File {
                    data: Vec::new(),
                    synced: Vec::new(),
                });
                st.name_op(vec![(d, name, Some(ino))]);
                Ok(ino)
            },
        )?;
        Ok(Box::new(SimWriteFile {
            disk: self.clone(),
            ino,
            path: path.to_path_buf(),
        }))
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.op(
            || format!("fsync dir {}", path.display()),
            |st| {
                let d = st.lookup(path)?;
                if !st.is_dir(d) {
                    return Err(io::Error::new(
                        io::ErrorKind::NotADirectory,
                        format!("{}: not a directory", path.display()),
                    ));
                }
                st.sync_dir(d);
                Ok(())
            },
        )
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.op(
            || format!("rename {} -> {}", from.display(), to.display()),
            |st| {
                let (fd, fname) = st.parent(from)?;
                let ino = st.entry(fd, &fname).ok_or_else(|| not_found(from))?;
                let (td, tname) = st.parent(to)?;
                if let Some(old) = st.entry(td, &tname) {
                    let (src_dir, dst_dir) = (st.is_dir(ino), st.is_dir(old));
                    let dst_empty = match st.nodes.get(&old) {
                        Some(Node::Dir { live, .. }) => live.is_empty(),
                        _ => true,
                    };
                    if src_dir != dst_dir || (dst_dir && !dst_empty) {
                        return Err(exists_err(to));
                    }
                }
                st.name_op(vec![(fd, fname, None), (td, tname, Some(ino))]);
                Ok(())
            },
        )
    }

    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        self.op(
            || format!("exchange {} <-> {}", a.display(), b.display()),
            |st| {
                let (ad, an) = st.parent(a)?;
                let (bd, bn) = st.parent(b)?;
                let ia = st.entry(ad, &an).ok_or_else(|| not_found(a))?;
                let ib = st.entry(bd, &bn).ok_or_else(|| not_found(b))?;
                st.name_op(vec![(ad, an, Some(ib)), (bd, bn, Some(ia))]);
                Ok(())
            },
        )
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        let data = self.op(
            || format!("open {}", path.display()),
            |st| match st.nodes.get(&st.lookup(path)?) {
                Some(Node::File { data, .. }) => Ok(data.clone()),
                _ => Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{}: is a directory", path.display()),
                )),
            },
        )?;
        Ok(Box::new(SimReadFile(Cursor::new(data))))
    }

    fn metadata(&self, path: &Path) -> io::Result<EntryMeta> {
        self.op(
            || format!("stat {}", path.display()),
            |st| match st.nodes.get(&st.lookup(path)?) {
                Some(Node::File { data, .. }) => Ok(EntryMeta {
                    is_dir: false,
                    len: data.len() as u64,
                }),
                Some(Node::Dir { .. }) => Ok(EntryMeta {
                    is_dir: true,
                    len: 0,
                }),
                None => Err(not_found(path)),
            },
        )
    }

    fn list(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.op(
            || format!("list {}", path.display()),
            |st| match st.nodes.get(&st.lookup(path)?) {
                Some(Node::Dir { live, .. }) => Ok(live
                    .iter()
                    .map(|(name, ino)| DirEntry {
                        name: name.clone(),
                        is_dir: st.is_dir(*ino),
                    })
                    .collect()),
                _ => Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{}: not a directory", path.display()),
                )),
            },
        )
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.op(
            || format!("unlink {}", path.display()),
            |st| {
                let (d, name) = st.parent(path)?;
                let ino = st.entry(d, &name).ok_or_else(|| not_found(path))?;
                if st.is_dir(ino) {
                    return Err(io::Error::new(
                        io::ErrorKind::IsADirectory,
                        format!("{}: is a directory", path.display()),
                    ));
                }
                st.name_op(vec![(d, name, None)]);
                Ok(())
            },
        )
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.op(
            || format!("rm -r {}", path.display()),
            |st| {
                let (d, name) = st.parent(path)?;
                let ino = st.entry(d, &name).ok_or_else(|| not_found(path))?;
                let mut ops = Vec::new();
                remove_tree(st, ino, &mut ops);
                st.pending.extend(ops);
                st.name_op(vec![(d, name, None)]);
                Ok(())
            },
        )
    }

    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockAttempt> {
        if let Some(held) = self.sim().locks.get(path) {
            return Ok(LockAttempt::HeldBy(held.clone()));
        }
        if self.metadata(path).is_err() {
            let mut f = self.create_file(path)?;
            f.write_all(holder.as_bytes())?;
        }
        self.sim()
            .locks
            .insert(path.to_path_buf(), holder.to_string());
        Ok(LockAttempt::Acquired(Box::new(SimLock {
            disk: self.clone(),
            path: path.to_path_buf(),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(disk: &SimDisk, p: &str) -> Option<Vec<u8>> {
        disk.tree()
            .into_iter()
            .find(|(q, _)| q == Path::new(p))
            .map(|(_, d)| d.unwrap_or_default())
    }

    fn write(disk: &SimDisk, p: &str, data: &[u8], sync: bool) {
        let mut f = disk.create_file(Path::new(p)).unwrap();
        f.write_all(data).unwrap();
        if sync {
            f.sync().unwrap();
        }
    }

    fn last_images(disk: &SimDisk) -> Vec<(String, SimDisk)> {
        disk.take_points().last().unwrap().images(64, 1)
    }

    #[test]
    fn unsynced_names_and_data_can_be_lost_and_synced_ones_cannot() {
        let disk = SimDisk::new();
        disk.create_dir(Path::new("/d")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.record();
        write(&disk, "/d/f", b"hello", true);
        let images = last_images(&disk);
        // The name was never synced: some disk lacks it, some has it with its synced data.
        assert!(images.iter().any(|(_, d)| has(d, "/d/f").is_none()));
        assert!(
            images
                .iter()
                .any(|(_, d)| has(d, "/d/f") == Some(b"hello".to_vec()))
        );
        disk.sync_dir(Path::new("/d")).unwrap();
        write(&disk, "/d/g", b"volatile", false);
        disk.sync_dir(Path::new("/d")).unwrap();
        for (label, d) in last_images(&disk) {
            assert_eq!(has(&d, "/d/f"), Some(b"hello".to_vec()), "{label}");
            // g's name is durable, its data never was.
            let g = has(&d, "/d/g").expect("g's name was synced");
            assert!(
                b"volatile".starts_with(&g) || g.len() == 8,
                "{label}: {g:?}"
            );
        }
    }

    #[test]
    fn a_rename_between_directories_is_atomic_and_ordered_per_directory() {
        let disk = SimDisk::new();
        for d in ["/a", "/b"] {
            disk.create_dir(Path::new(d)).unwrap();
        }
        write(&disk, "/a/x", b"1", true);
        disk.sync_dir(Path::new("/")).unwrap();
        disk.sync_dir(Path::new("/a")).unwrap();
        disk.record();
        disk.rename(Path::new("/a/x"), Path::new("/b/x")).unwrap();
        write(&disk, "/b/later", b"2", true);
        for (label, d) in last_images(&disk) {
            let (in_a, in_b) = (has(&d, "/a/x").is_some(), has(&d, "/b/x").is_some());
            assert!(in_a != in_b, "{label}: x in /a {in_a}, in /b {in_b}");
            // /b's ops persist in order: `later` only after the rename into /b.
            assert!(has(&d, "/b/later").is_none() || in_b, "{label}");
        }
    }

    #[test]
    fn syncing_one_directory_keeps_the_order_of_the_others() {
        let disk = SimDisk::new();
        for d in ["/a", "/b"] {
            disk.create_dir(Path::new(d)).unwrap();
        }
        disk.sync_dir(Path::new("/")).unwrap();
        write(&disk, "/b/first", b"", true);
        write(&disk, "/a/x", b"", true);
        disk.rename(Path::new("/a/x"), Path::new("/b/x")).unwrap();
        write(&disk, "/b/after", b"", true);
        disk.record();
        // Syncing /a makes the rename durable, and with it /b's earlier `first`, but not
        // /b's later `after`.
        disk.sync_dir(Path::new("/a")).unwrap();
        let images = last_images(&disk);
        for (label, d) in &images {
            assert!(
                has(d, "/b/x").is_some() && has(d, "/b/first").is_some(),
                "{label}"
            );
        }
        assert!(images.iter().any(|(_, d)| has(d, "/b/after").is_none()));
    }
}
