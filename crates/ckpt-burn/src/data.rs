//! A resumable data loader implementing Burn's [`DataLoader`] trait.
//!
//! The order of epoch `e` is a pure function of `(shuffle seed, e, shard)`, where the shard is
//! the index range of the dataset the loader reads; the position inside the epoch is a shared
//! [`DataCursor`] that every `next()` advances. Capturing the cursor at an optimizer-step
//! boundary and setting it again after a restart continues mid-epoch with exactly the batches
//! the uninterrupted run would have seen. Batches are built on the calling thread (no
//! prefetching workers, whose merge order would be nondeterministic).

use std::sync::{Arc, Mutex};

use burn::data::dataloader::{DataLoader, DataLoaderIterator, Dataset, Progress, batcher::Batcher};
use burn::data::dataset::DatasetError;
use burn::tensor::Device;

use crate::{DataCursor, Error, Result};

/// splitmix64: a tiny, well-mixed, platform-independent PRNG step.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mixes several words into one seed.
pub fn mix_seed(words: &[u64]) -> u64 {
    let mut s = 0x6A09_E667_F3BC_C908u64;
    for &w in words {
        s ^= w;
        s = splitmix64(&mut s);
    }
    s
}

static BACKEND_RNG: Mutex<()> = Mutex::new(());

/// A process-wide lock for "re-seed the backend RNG, then draw from it" (Burn's backend RNG is
/// global to the process): rank threads that re-seed per step hold it across seeding and the
/// forward/backward pass, so their draws never interleave. Poisoning is ignored (the lock
/// guards no data).
pub fn backend_rng_lock() -> std::sync::MutexGuard<'static, ()> {
    BACKEND_RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `pass` (a forward/backward pass) with the backend RNG of `device` re-seeded from
/// `(seed, step, item)` and [`backend_rng_lock`] held, so it draws the same masks whenever it
/// runs at that position; without a seed, runs it as is. The deterministic mode of both
/// learner strategies.
pub fn seeded_pass<T>(
    device: &Device,
    seed: Option<u64>,
    step: u64,
    item: u64,
    pass: impl FnOnce() -> T,
) -> T {
    match seed {
        Some(seed) => {
            let _rng = backend_rng_lock();
            device.seed(mix_seed(&[seed, step, item]));
            pass()
        }
        None => pass(),
    }
}

/// The permutation of `n` items for `(seed, epoch, shard)`; a pure function of its inputs.
pub fn epoch_permutation(seed: u64, epoch: u64, shard: (usize, usize), n: usize) -> Vec<u32> {
    let mut perm: Vec<u32> = (0..n as u32).collect();
    let mut s = mix_seed(&[seed, epoch, shard.0 as u64, shard.1 as u64]);
    for i in (1..n).rev() {
        let j = (splitmix64(&mut s) % (i as u64 + 1)) as usize;
        perm.swap(i, j);
    }
    perm
}

/// The permutation cache: the epoch it is for and the order.
type PermCache = Arc<Mutex<Option<(u64, Arc<Vec<u32>>)>>>;

struct Inner<I, O> {
    dataset: Arc<dyn Dataset<I>>,
    batcher: Arc<dyn Batcher<I, O>>,
    batch_size: usize,
}

/// A data loader whose position can be captured and restored exactly. Cloning shares the
/// cursor.
pub struct ResumableDataLoader<I, O> {
    inner: Arc<Inner<I, O>>,
    /// Dataset index range this loader reads (its shard).
    range: (usize, usize),
    device: Device,
    cursor: Arc<Mutex<DataCursor>>,
    perm: PermCache,
}

impl<I, O> Clone for ResumableDataLoader<I, O> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            range: self.range,
            device: self.device.clone(),
            cursor: self.cursor.clone(),
            perm: self.perm.clone(),
        }
    }
}

impl<I, O> std::fmt::Debug for ResumableDataLoader<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumableDataLoader")
            .field("range", &self.range)
            .field("batch_size", &self.inner.batch_size)
            .field(
                "cursor",
                &*self.cursor.lock().unwrap_or_else(|e| e.into_inner()),
            )
            .finish()
    }
}

impl<I: Send + Sync + 'static, O: Send + 'static> ResumableDataLoader<I, O> {
    /// A loader over the whole dataset, starting at epoch 0, position 0.
    pub fn new(
        dataset: Arc<dyn Dataset<I>>,
        batcher: Arc<dyn Batcher<I, O>>,
        batch_size: usize,
        shuffle_seed: u64,
        device: Device,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        let n = dataset.len();
        if n == 0 {
            return Err(Error::Config("the dataset is empty".into()));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                dataset,
                batcher,
                batch_size,
            }),
            range: (0, n),
            device,
            cursor: Arc::new(Mutex::new(DataCursor {
                epoch: 0,
                position: 0,
                shuffle_seed,
            })),
            perm: Arc::new(Mutex::new(None)),
        })
    }

    /// The current cursor (the next item to yield).
    pub fn cursor(&self) -> DataCursor {
        *self.cursor.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the cursor (after a restore). Fails if the position is past the end of the shard.
    pub fn set_cursor(&self, cursor: DataCursor) -> Result<()> {
        if cursor.position > self.len_items() as u64 {
            return Err(Error::Config(format!(
                "data cursor position {} is past the end of the shard ({} items)",
                cursor.position,
                self.len_items()
            )));
        }
        *self.cursor.lock().unwrap_or_else(|e| e.into_inner()) = cursor;
        Ok(())
    }

    fn len_items(&self) -> usize {
        self.range.1 - self.range.0
    }

    fn permutation(&self, epoch: u64, seed: u64) -> Arc<Vec<u32>> {
        let mut cache = self.perm.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((e, p)) = cache.as_ref()
            && *e == epoch
        {
            return p.clone();
        }
        let p = Arc::new(epoch_permutation(seed, epoch, self.range, self.len_items()));
        *cache = Some((epoch, p.clone()));
        p
    }

    /// Takes the batch at the cursor of `epoch` and advances the cursor; `None` at the end of
    /// that epoch (the cursor then moves to the start of the next one).
    fn take(&self, epoch: u64) -> Option<std::result::Result<O, DatasetError>> {
        let n = self.len_items() as u64;
        let (pos, seed) = {
            let mut c = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
            if c.epoch != epoch {
                return None;
            }
            if c.position >= n {
                c.epoch += 1;
                c.position = 0;
                return None;
            }
            (c.position, c.shuffle_seed)
        };
        let perm = self.permutation(epoch, seed);
        let end = (pos + self.inner.batch_size as u64).min(n);
        let mut items = Vec::with_capacity((end - pos) as usize);
        for &i in &perm[pos as usize..end as usize] {
            match self.inner.dataset.get(self.range.0 + i as usize) {
                Ok(item) => items.push(item),
                Err(e) => return Some(Err(e)),
            }
        }
        self.cursor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .position = end;
        Some(Ok(self.inner.batcher.batch(items, &self.device)))
    }

    /// The next batch, rolling over to the next epoch at the end of one. Returns the epoch the
    /// batch belongs to.
    pub fn next_batch(&self) -> Result<(u64, O)> {
        for _ in 0..2 {
            let c = self.cursor();
            match self.take(c.epoch) {
                Some(Ok(b)) => return Ok((c.epoch, b)),
                Some(Err(e)) => {
                    return Err(Error::Data {
                        epoch: c.epoch,
                        position: c.position,
                        reason: e.to_string(),
                    });
                }
                None => continue,
            }
        }
        Err(Error::Config("the data loader yields no batches".into()))
    }
}

struct Iter<'a, I, O> {
    loader: &'a ResumableDataLoader<I, O>,
    epoch: u64,
}

impl<I: Send + Sync + 'static, O: Send + 'static> Iterator for Iter<'_, I, O> {
    type Item = std::result::Result<O, DatasetError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.loader.take(self.epoch)
    }
}

impl<I: Send + Sync + 'static, O: Send + 'static> DataLoaderIterator<O> for Iter<'_, I, O> {
    fn progress(&self) -> Progress {
        let c = self.loader.cursor();
        let total = self.loader.len_items();
        let done = if c.epoch == self.epoch {
            c.position as usize
        } else {
            total
        };
        Progress::new(done, total, Some("items".into()))
    }
}

impl<I: Send + Sync + 'static, O: Send + 'static> DataLoader<O> for ResumableDataLoader<I, O> {
    /// Iterates the rest of the current epoch, from the cursor. If the cursor is at the end of
    /// an epoch, it first moves to the start of the next one.
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<O> + 'a> {
        let epoch = {
            let mut c = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
            if c.position >= self.len_items() as u64 {
                c.epoch += 1;
                c.position = 0;
            }
            c.epoch
        };
        Box::new(Iter {
            loader: self,
            epoch,
        })
    }

    fn num_items(&self) -> usize {
        self.len_items()
    }

    /// The same loader (shared cursor) yielding batches on `device`.
    fn to_device(&self, device: &Device) -> Arc<dyn DataLoader<O>> {
        let mut l = self.clone();
        l.device = device.clone();
        Arc::new(l)
    }

    /// A loader over items `start..end` of this one's shard, with its own cursor at the start
    /// of the current epoch; its order is a function of the seed, epoch and the new range.
    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<O>> {
        let end = end.min(self.len_items());
        let start = start.min(end);
        let c = self.cursor();
        Arc::new(Self {
            inner: self.inner.clone(),
            range: (self.range.0 + start, self.range.0 + end),
            device: self.device.clone(),
            cursor: Arc::new(Mutex::new(DataCursor {
                epoch: c.epoch,
                position: 0,
                shuffle_seed: c.shuffle_seed,
            })),
            perm: Arc::new(Mutex::new(None)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::data::dataset::InMemDataset;

    struct Ids;
    impl Batcher<u32, Vec<u32>> for Ids {
        fn batch(&self, items: Vec<u32>, _device: &Device) -> Vec<u32> {
            items
        }
    }

    fn loader(seed: u64) -> ResumableDataLoader<u32, Vec<u32>> {
        ResumableDataLoader::new(
            Arc::new(InMemDataset::new((0..10u32).collect())),
            Arc::new(Ids),
            3,
            seed,
            Device::flex(),
        )
        .unwrap()
    }

    #[test]
    fn order_is_a_permutation_and_resumes_mid_epoch() {
        let a = loader(5);
        let all: Vec<Vec<u32>> = (0..9).map(|_| a.next_batch().unwrap().1).collect();
        let mut first: Vec<u32> = all[..4].concat();
        first.sort();
        assert_eq!(first, (0..10).collect::<Vec<_>>());
        assert_ne!(all[..4].concat(), all[4..8].concat(), "epochs reshuffle");

        let b = loader(5);
        for _ in 0..5 {
            b.next_batch().unwrap();
        }
        let c = loader(5);
        c.set_cursor(b.cursor()).unwrap();
        let rest: Vec<Vec<u32>> = (5..9).map(|_| c.next_batch().unwrap().1).collect();
        assert_eq!(rest, all[5..9].to_vec());
        assert_ne!(loader(6).next_batch().unwrap().1, all[0]);
    }

    #[test]
    fn burn_iterator_follows_the_cursor() {
        let a = loader(1);
        let e0: Vec<Vec<u32>> = a.iter().map(|b| b.unwrap()).collect();
        assert_eq!(e0.len(), 4);
        let b = loader(1);
        b.next_batch().unwrap();
        let rest: Vec<Vec<u32>> = b.iter().map(|b| b.unwrap()).collect();
        assert_eq!(rest, e0[1..].to_vec());
        assert!(b.iter().progress().items_processed == 0);
        assert!(
            b.set_cursor(DataCursor {
                epoch: 0,
                position: 11,
                shuffle_seed: 1
            })
            .is_err()
        );
    }
}
