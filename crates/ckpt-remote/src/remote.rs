//! A checkpoint prefix in an object store, and the publication protocol without rename (see the
//! crate docs): parts first, `manifest.json` last, `latest` by conditional put, retention only
//! behind a published newer checkpoint.

use std::{
    io::Read,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use ckpt_core::{
    Engine, Manifest, SaveEvent, Snapshot,
    layout::{MANIFEST_FILE, checkpoint_dir_name},
};
use futures_util::StreamExt;
use object_store::{
    ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig, UpdateVersion,
    WriteMultipart,
    aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut},
    memory::InMemory,
    path::Path as Key,
};
use xxhash_rust::xxh3::Xxh3;

use crate::{Error, Result};

/// The name of the pointer object under the prefix.
const LATEST: &str = "latest";

/// How uploads behave. The defaults suit a training node sharing its network with training.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Parts larger than this are uploaded in multipart chunks of this size (at least 5 MiB,
    /// S3's minimum).
    pub part_size: usize,
    /// Chunks of one file in flight at once.
    pub concurrency: usize,
    /// Upload bandwidth cap in bytes per second (`None`: unlimited).
    pub max_bytes_per_sec: Option<u64>,
    /// Remote retention: keep the newest N checkpoints (`None`: keep all).
    pub keep_last: Option<usize>,
    /// Retries of a failed request (5xx, timeouts, connection errors), with backoff.
    pub max_retries: usize,
    /// Give up retrying a request after this long.
    pub retry_timeout: Duration,
    /// Store options applied over the `AWS_*` environment, by `object_store` config key
    /// (`endpoint`, `allow_http`, `region`, ...). Keep credentials in the environment.
    pub store_options: Vec<(String, String)>,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            part_size: 16 << 20,
            concurrency: 4,
            max_bytes_per_sec: None,
            keep_last: None,
            max_retries: 4,
            retry_timeout: Duration::from_secs(30),
            store_options: Vec::new(),
        }
    }
}

/// A checkpoint found under a remote prefix.
#[derive(Debug, Clone)]
pub struct RemoteCheckpoint {
    /// Step.
    pub step: u64,
    /// The key of its manifest.
    pub manifest_key: String,
    /// The manifest, when it parsed and every listed part exists with its size.
    pub manifest: Option<Manifest>,
    /// Why it is not valid, when it is not.
    pub invalid: Option<String>,
    /// Whether `latest` names it.
    pub latest: bool,
}

/// What `latest` named when read, and the version a conditional update must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatestPointer {
    /// The checkpoint it names (`step-*`).
    pub name: String,
    version: UpdateVersion,
}

/// What [`Remote::restore_newest`] did.
#[derive(Debug)]
pub struct Restored {
    /// The step restored into the local root.
    pub step: u64,
    /// The local publication.
    pub event: SaveEvent,
    /// Newer remote checkpoints skipped, each with the reason (naming the key).
    pub skipped: Vec<(u64, String)>,
}

/// What [`Remote::begin_upload`] found for a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadPlan {
    /// The parts must be uploaded: the step is not in the store, or a different copy of it
    /// was there and its manifest has been removed.
    Parts,
    /// The store already holds an identical copy: only `latest` and retention remain.
    AlreadyThere,
}

/// What one upload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    /// Step.
    pub step: u64,
    /// Bytes uploaded (0 when the step was already there, identical).
    pub bytes: u64,
    /// Time it took.
    pub elapsed: Duration,
    /// Whether `latest` now names it.
    pub latest: bool,
    /// Steps retention removed afterwards.
    pub removed: Vec<u64>,
}

/// A checkpoint prefix in an object store (`s3://bucket/prefix`), with its own small runtime
/// for the store's async client.
#[derive(Debug, Clone)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: Key,
    url: String,
    rt: Arc<tokio::runtime::Runtime>,
    config: RemoteConfig,
}

fn runtime() -> Result<Arc<tokio::runtime::Runtime>> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ckpt-remote")
        .enable_all()
        .build()
        .map(Arc::new)
        .map_err(|e| Error::Url {
            url: String::new(),
            reason: format!("cannot start the object-store runtime: {e}"),
        })
}

impl Remote {
    /// Opens `url`: `s3://bucket/prefix` (credentials, region and endpoint from the usual
    /// `AWS_*` variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ENDPOINT` and `AWS_ALLOW_HTTP=true` for an S3-compatible server over plain HTTP), or
    /// `memory://name` (an in-process store, for tests). The store must support conditional
    /// puts (`If-Match` / `If-None-Match`), as S3, MinIO, R2 and Ceph do.
    pub fn open(url: &str, config: RemoteConfig) -> Result<Self> {
        let bad = |reason: &str| Error::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("not a URL (expected s3://bucket/prefix)"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let store: Arc<dyn ObjectStore> = match scheme {
            "s3" => {
                let retry = RetryConfig {
                    max_retries: config.max_retries,
                    retry_timeout: config.retry_timeout,
                    ..Default::default()
                };
                let mut b = AmazonS3Builder::from_env();
                for (k, v) in &config.store_options {
                    let key: AmazonS3ConfigKey = k
                        .parse()
                        .map_err(|e: object_store::Error| bad(&e.to_string()))?;
                    b = b.with_config(key, v);
                }
                Arc::new(
                    b.with_bucket_name(bucket)
                        .with_conditional_put(S3ConditionalPut::ETagMatch)
                        .with_retry(retry)
                        .build()
                        .map_err(|e| bad(&e.to_string()))?,
                )
            }
            "memory" => Arc::new(InMemory::new()),
            _ => return Err(bad("unsupported scheme (supported: s3://, memory://)")),
        };
        Ok(Self {
            store,
            prefix: Key::from(prefix.trim_matches('/')),
            url: url.trim_end_matches('/').to_string(),
            rt: runtime()?,
            config,
        })
    }

    /// The URL this prefix was opened with (it never holds credentials: those come from the
    /// environment).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of checkpoint `step` under this prefix (`URL/step-…`), as messages name it.
    pub fn checkpoint_url(&self, step: u64) -> String {
        format!("{}/{}", self.url, checkpoint_dir_name(step))
    }

    /// The configuration.
    pub fn config(&self) -> &RemoteConfig {
        &self.config
    }

    fn key(&self, rel: &str) -> Key {
        rel.split('/')
            .filter(|s| !s.is_empty())
            .fold(self.prefix.clone(), |k, part| k.clone().join(part))
    }

    fn step_key(&self, step: u64, name: &str) -> Key {
        self.key(&format!("{}/{name}", checkpoint_dir_name(step)))
    }

    fn store_err(&self, key: &Key) -> impl Fn(object_store::Error) -> Error {
        let key = key.to_string();
        move |source| Error::Store {
            key: key.clone(),
            source,
        }
    }

    /// What `latest` names, with the version a conditional update must match (None: no
    /// pointer yet).
    pub fn latest_versioned(&self) -> Result<Option<LatestPointer>> {
        Ok(self
            .read_latest_versioned()?
            .map(|(name, version)| LatestPointer { name, version }))
    }

    /// The name `latest` holds and the version to update it from (None: no pointer yet).
    fn read_latest_versioned(&self) -> Result<Option<(String, UpdateVersion)>> {
        let key = self.key(LATEST);
        let got = self.rt.block_on(async {
            match self.store.get(&key).await {
                Ok(r) => {
                    let version = UpdateVersion {
                        e_tag: r.meta.e_tag.clone(),
                        version: r.meta.version.clone(),
                    };
                    Ok(Some((r.bytes().await?, version)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match got.map_err(self.store_err(&key))? {
            None => Ok(None),
            Some((bytes, version)) => {
                let name = String::from_utf8_lossy(&bytes).trim().to_string();
                if ckpt_core::layout::parse_step_dir(&name).is_none() {
                    return Err(Error::Corrupt {
                        key: key.to_string(),
                        reason: format!("does not name a checkpoint: {name:?}"),
                    });
                }
                Ok(Some((name, version)))
            }
        }
    }

    /// The checkpoint `latest` names (None: no pointer yet).
    pub fn latest(&self) -> Result<Option<String>> {
        Ok(self.read_latest_versioned()?.map(|(n, _)| n))
    }

    /// Every `step-*` under the prefix, oldest first, each checked against its manifest by
    /// size (no part is downloaded; see [`Remote::verify`]).
    pub fn list(&self) -> Result<Vec<RemoteCheckpoint>> {
        let latest = self.latest().ok().flatten();
        let listed = self.rt.block_on(async {
            let mut objects = Vec::new();
            let mut s = self.store.list(Some(&self.prefix));
            while let Some(m) = s.next().await {
                objects.push(m?);
            }
            Ok::<_, object_store::Error>(objects)
        });
        let objects = listed.map_err(self.store_err(&self.prefix))?;
        // step -> (name -> size)
        let mut steps: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, u64>> =
            Default::default();
        let depth = self.prefix.parts().count();
        for o in objects {
            let parts: Vec<String> = o.location.parts().map(|p| p.as_ref().to_string()).collect();
            if parts.len() != depth + 2 {
                continue;
            }
            if let Some(step) = ckpt_core::layout::parse_step_dir(&parts[depth]) {
                steps
                    .entry(step)
                    .or_default()
                    .insert(parts[depth + 1].clone(), o.size);
            }
        }
        let mut out = Vec::new();
        for (step, files) in steps {
            let mkey = self.step_key(step, MANIFEST_FILE);
            let (manifest, invalid) = match self.manifest(step) {
                Err(e) => (None, Some(e.to_string())),
                Ok(m) => match m.files.iter().find_map(|f| match files.get(&f.name) {
                    None => Some(format!("{} is missing", self.step_key(step, &f.name))),
                    Some(&n) if n != f.size => Some(format!(
                        "{}: size {n} differs from the manifest's {}",
                        self.step_key(step, &f.name),
                        f.size
                    )),
                    Some(_) => None,
                }) {
                    Some(reason) => (None, Some(reason)),
                    None => (Some(m), None),
                },
            };
            out.push(RemoteCheckpoint {
                step,
                manifest_key: mkey.to_string(),
                manifest,
                invalid,
                latest: latest.as_deref() == Some(checkpoint_dir_name(step).as_str()),
            });
        }
        Ok(out)
    }

    /// Reads and checks (self-checksum, step) the manifest of remote `step`.
    pub fn manifest(&self, step: u64) -> Result<Manifest> {
        let key = self.step_key(step, MANIFEST_FILE);
        let bytes = self
            .rt
            .block_on(async { self.store.get(&key).await?.bytes().await })
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => Error::Corrupt {
                    key: key.to_string(),
                    reason: "manifest is missing (checkpoint incomplete)".into(),
                },
                e => Error::Store {
                    key: key.to_string(),
                    source: e,
                },
            })?;
        let m =
            Manifest::from_bytes(&bytes, Path::new(key.as_ref())).map_err(|e| Error::Corrupt {
                key: key.to_string(),
                reason: e.to_string(),
            })?;
        if m.step != step {
            return Err(Error::Corrupt {
                key: key.to_string(),
                reason: format!("manifest says step {}, the prefix is step {step}", m.step),
            });
        }
        Ok(m)
    }

    /// Streams remote part `name` of `step` into `sink`, checking its size and XXH3 against
    /// `m`'s entry; returns the bytes written.
    fn fetch_part(&self, m: &Manifest, name: &str, sink: &mut dyn std::io::Write) -> Result<u64> {
        let key = self.step_key(m.step, name);
        let corrupt = |reason: String| Error::Corrupt {
            key: key.to_string(),
            reason,
        };
        let entry = m
            .file(name)
            .ok_or_else(|| corrupt("not listed in the manifest".into()))?;
        let mut hasher = Xxh3::new();
        let mut n = 0u64;
        let store_err = self.store_err(&key);
        self.rt
            .block_on(async {
                let mut s = self.store.get(&key).await?.into_stream();
                while let Some(chunk) = s.next().await {
                    let chunk = chunk?;
                    hasher.update(&chunk);
                    n += chunk.len() as u64;
                    sink.write_all(&chunk)
                        .map_err(|e| object_store::Error::Generic {
                            store: "local",
                            source: Box::new(e),
                        })?;
                }
                Ok(())
            })
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => corrupt("part is missing".into()),
                e => store_err(e),
            })?;
        if n != entry.size {
            return Err(corrupt(format!(
                "size {n} differs from the manifest's {}",
                entry.size
            )));
        }
        let hex = format!("{:016x}", hasher.digest());
        if hex != entry.xxh3 {
            return Err(corrupt(format!(
                "checksum mismatch (manifest {}, object {hex})",
                entry.xxh3
            )));
        }
        Ok(n)
    }

    /// Fully verifies remote `step`: its manifest and every part's size and checksum
    /// (downloaded and hashed, not kept). Errors name the key.
    pub fn verify(&self, step: u64) -> Result<Manifest> {
        let m = self.manifest(step)?;
        for f in &m.files {
            self.fetch_part(&m, &f.name, &mut std::io::sink())?;
        }
        Ok(m)
    }

    /// Reads remote part `name` of `step` into memory, checked against the manifest.
    pub fn read_part(&self, step: u64, name: &str) -> Result<Vec<u8>> {
        let m = self.manifest(step)?;
        let mut v = Vec::new();
        self.fetch_part(&m, name, &mut v)?;
        Ok(v)
    }

    /// Uploads the published local checkpoint `dir`, then moves `latest` to it (never
    /// backwards) and applies remote retention. See the crate docs for the protocol and its
    /// crash cases. A failure publishes nothing: parts may remain, unlisted by any manifest,
    /// and multipart uploads are aborted.
    ///
    /// It is [`Remote::begin_upload`], [`Remote::upload_parts`] of every part and
    /// [`Remote::commit_upload`] in one call; a sharded checkpoint splits the parts between
    /// its ranks instead.
    pub fn upload(&self, dir: &Path) -> Result<Uploaded> {
        let t0 = Instant::now();
        let m = ckpt_core::read_manifest(dir)?;
        let plan = self.begin(&m)?;
        let bytes = match plan {
            UploadPlan::Parts => self.parts(dir, &m, m.files.iter().map(|f| f.name.as_str()))?,
            UploadPlan::AlreadyThere => 0,
        };
        self.commit(dir, &m, plan, bytes, t0)
    }

    /// The first step of an upload of the published local checkpoint `dir`: compares it with
    /// the remote copy of its step. An identical remote copy needs no parts
    /// ([`UploadPlan::AlreadyThere`]: a re-run, or a retry). A different one (a replaced step)
    /// stops existing first, its manifest deleted, so no reader can pair the old manifest
    /// with new parts.
    pub fn begin_upload(&self, dir: &Path) -> Result<UploadPlan> {
        self.begin(&ckpt_core::read_manifest(dir)?)
    }

    fn begin(&self, m: &Manifest) -> Result<UploadPlan> {
        let step = m.step;
        let existing = match self.manifest(step) {
            Ok(m) => Some(m),
            // Missing or unreadable: (re)upload it.
            Err(Error::Corrupt { .. }) => None,
            Err(Error::Store { key, source }) => return Err(Error::Upload { step, key, source }),
            Err(e) => return Err(e),
        };
        match existing {
            Some(e) if e.files == m.files => Ok(UploadPlan::AlreadyThere),
            Some(_) => {
                let mkey = self.step_key(step, MANIFEST_FILE);
                self.rt
                    .block_on(self.store.delete(&mkey))
                    .map_err(|source| Error::Upload {
                        step,
                        key: mkey.to_string(),
                        source,
                    })?;
                Ok(UploadPlan::Parts)
            }
            None => Ok(UploadPlan::Parts),
        }
    }

    /// Uploads the parts `names` of the published local checkpoint `dir` (after
    /// [`Remote::begin_upload`] said [`UploadPlan::Parts`]), each checked against the local
    /// manifest while it is read. Publishes nothing. Returns the bytes uploaded. `dir` needs
    /// only its manifest and these parts (one rank's share of a sharded checkpoint).
    pub fn upload_parts<'a>(
        &self,
        dir: &Path,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<u64> {
        self.parts(dir, &ckpt_core::read_manifest(dir)?, names)
    }

    fn parts<'a>(
        &self,
        dir: &Path,
        m: &Manifest,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<u64> {
        let mut throttle = Throttle::new(self.config.max_bytes_per_sec);
        let mut bytes = 0;
        for name in names {
            let f = m.file(name).ok_or_else(|| Error::Corrupt {
                key: self.step_key(m.step, name).to_string(),
                reason: format!("not a part of {}", dir.join(MANIFEST_FILE).display()),
            })?;
            bytes += self.upload_part(m.step, &dir.join(name), f, &mut throttle)?;
        }
        Ok(bytes)
    }

    /// The last step of an upload: with [`UploadPlan::Parts`], checks that every part the
    /// local manifest of `dir` lists is in the store with its size (whoever uploaded it),
    /// then writes the manifest, the commit point. Then moves `latest` to the step (never
    /// backwards) and applies remote retention. `bytes` and `started` are reported back.
    pub fn commit_upload(
        &self,
        dir: &Path,
        plan: UploadPlan,
        bytes: u64,
        started: Instant,
    ) -> Result<Uploaded> {
        self.commit(dir, &ckpt_core::read_manifest(dir)?, plan, bytes, started)
    }

    fn commit(
        &self,
        dir: &Path,
        m: &Manifest,
        plan: UploadPlan,
        bytes: u64,
        started: Instant,
    ) -> Result<Uploaded> {
        let step = m.step;
        if plan == UploadPlan::Parts {
            for f in &m.files {
                let key = self.step_key(step, &f.name);
                let upload_err = |source| Error::Upload {
                    step,
                    key: key.to_string(),
                    source,
                };
                let meta = self
                    .rt
                    .block_on(self.store.head(&key))
                    .map_err(upload_err)?;
                if meta.size != f.size {
                    return Err(Error::Corrupt {
                        key: key.to_string(),
                        reason: format!(
                            "uploaded size {} differs from the manifest's {}; step {step} was \
                             not published",
                            meta.size, f.size
                        ),
                    });
                }
            }
            // The commit point: the manifest, only after every part completed.
            let mkey = self.step_key(step, MANIFEST_FILE);
            let manifest_bytes =
                std::fs::read(dir.join(MANIFEST_FILE)).map_err(|e| Error::Local {
                    step,
                    path: dir.join(MANIFEST_FILE),
                    source: e,
                })?;
            self.rt
                .block_on(self.store.put(&mkey, PutPayload::from(manifest_bytes)))
                .map_err(|source| Error::Upload {
                    step,
                    key: mkey.to_string(),
                    source,
                })?;
        }
        let latest = self.move_latest(step)?;
        let removed = self.apply_retention()?;
        Ok(Uploaded {
            step,
            bytes,
            elapsed: started.elapsed(),
            latest,
            removed,
        })
    }

    /// Uploads one part file, hashing it as it is read; the hash must match the local
    /// manifest's, or the upload is aborted.
    fn upload_part(
        &self,
        step: u64,
        path: &Path,
        entry: &ckpt_core::layout::FileEntry,
        throttle: &mut Throttle,
    ) -> Result<u64> {
        let key = self.step_key(step, &entry.name);
        let local = |source| Error::Local {
            step,
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(local)?;
        let chunk = self.config.part_size.max(5 << 20);
        let mut hasher = Xxh3::new();
        let read_chunk = |file: &mut std::fs::File, hasher: &mut Xxh3| -> Result<Bytes> {
            let mut buf = Vec::with_capacity(chunk);
            file.by_ref()
                .take(chunk as u64)
                .read_to_end(&mut buf)
                .map_err(local)?;
            hasher.update(&buf);
            Ok(Bytes::from(buf))
        };
        let upload_err = |source| Error::Upload {
            step,
            key: key.to_string(),
            source,
        };
        let mut sent = 0u64;
        if entry.size <= chunk as u64 {
            let data = read_chunk(&mut file, &mut hasher)?;
            sent += data.len() as u64;
            check_local(step, path, entry, sent, &hasher)?;
            self.rt.block_on(throttle.wait(sent));
            self.rt
                .block_on(self.store.put(&key, PutPayload::from(data)))
                .map_err(upload_err)?;
            return Ok(sent);
        }
        let concurrency = self.config.concurrency.max(1);
        let result = self.rt.block_on(async {
            let upload = self.store.put_multipart(&key).await?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, chunk);
            loop {
                let data = match read_chunk(&mut file, &mut hasher) {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = w.abort().await;
                        return Ok(Err(e));
                    }
                };
                if data.is_empty() {
                    break;
                }
                sent += data.len() as u64;
                throttle.wait(sent).await;
                if let Err(e) = w.wait_for_capacity(concurrency).await {
                    let _ = w.abort().await;
                    return Err(e);
                }
                w.put(data);
            }
            if let Err(e) = check_local(step, path, entry, sent, &hasher) {
                let _ = w.abort().await;
                return Ok(Err(e));
            }
            w.finish().await.map(|_| Ok(()))
        });
        result.map_err(upload_err)??;
        Ok(sent)
    }

    /// Moves `latest` to `step` by a conditional put, unless it already names `step` or a
    /// newer one. Returns whether it now names `step`; a concurrent change is
    /// [`Error::LostRace`].
    fn move_latest(&self, step: u64) -> Result<bool> {
        let name = checkpoint_dir_name(step);
        let current = self.latest_versioned()?;
        if let Some(c) = &current
            && ckpt_core::layout::parse_step_dir(&c.name).is_some_and(|s| s >= step)
        {
            return Ok(c.name == name);
        }
        self.compare_and_set_latest(step, current.as_ref())?;
        Ok(true)
    }

    /// Points `latest` at `step` if it is still what `seen` says (`None`: still absent), by
    /// one conditional put; otherwise [`Error::LostRace`]. [`Remote::upload`] calls it; it is
    /// public for tools that publish by hand.
    pub fn compare_and_set_latest(&self, step: u64, seen: Option<&LatestPointer>) -> Result<()> {
        let key = self.key(LATEST);
        let name = checkpoint_dir_name(step);
        let mode = match seen {
            Some(p) => PutMode::Update(p.version.clone()),
            None => PutMode::Create,
        };
        let put = self.rt.block_on(self.store.put_opts(
            &key,
            PutPayload::from(format!("{name}\n").into_bytes()),
            PutOptions::from(mode),
        ));
        match put {
            Ok(_) => Ok(()),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Err(Error::LostRace {
                step,
                key: key.to_string(),
                current: self.latest().ok().flatten(),
            }),
            Err(source) => Err(Error::Upload {
                step,
                key: key.to_string(),
                source,
            }),
        }
    }

    /// Remote retention from the configuration's `keep_last` (nothing when unset).
    fn apply_retention(&self) -> Result<Vec<u64>> {
        match self.config.keep_last {
            Some(keep) => self.prune(keep),
            None => Ok(Vec::new()),
        }
    }

    /// Keeps the newest `keep` valid checkpoints at or below the one `latest` names; each
    /// older one loses its manifest first (it stops existing at once), then its parts.
    /// Returns the removed steps.
    pub fn prune(&self, keep: usize) -> Result<Vec<u64>> {
        let Some(latest) = self
            .latest()?
            .and_then(|n| ckpt_core::layout::parse_step_dir(&n))
        else {
            return Ok(Vec::new());
        };
        let valid: Vec<u64> = self
            .list()?
            .into_iter()
            .filter(|c| c.manifest.is_some() && c.step <= latest)
            .map(|c| c.step)
            .collect();
        let cut = valid.len().saturating_sub(keep.max(1));
        let mut removed = Vec::new();
        for &step in &valid[..cut] {
            self.delete_step(step)?;
            removed.push(step);
        }
        Ok(removed)
    }

    /// Deletes remote `step`: its manifest first, then everything else under it.
    pub fn delete_step(&self, step: u64) -> Result<()> {
        let mkey = self.step_key(step, MANIFEST_FILE);
        let dir = self.key(&checkpoint_dir_name(step));
        self.rt.block_on(async {
            match self.store.delete(&mkey).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.store_err(&mkey)(e)),
            }
            let mut s = self.store.list(Some(&dir));
            let mut keys = Vec::new();
            while let Some(m) = s.next().await {
                keys.push(m.map_err(self.store_err(&dir))?.location);
            }
            for k in keys {
                match self.store.delete(&k).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.store_err(&k)(e)),
                }
            }
            Ok(())
        })
    }

    /// Removes what no manifest publishes: `step-*` prefixes whose manifest is missing or
    /// invalid (failed or interrupted uploads). Run it when no writer is uploading to the
    /// prefix. Returns the removed steps.
    pub fn garbage_collect(&self) -> Result<Vec<u64>> {
        let mut removed = Vec::new();
        for c in self.list()? {
            if c.manifest.is_none() && !c.latest {
                self.delete_step(c.step)?;
                removed.push(c.step);
            }
        }
        Ok(removed)
    }

    /// Downloads remote `step` into the local root of `engine`, verifying every part against
    /// the remote manifest while writing it, and publishes it there with the engine's own
    /// protocol. Returns the local save event.
    pub fn restore_into(&self, engine: &mut Engine, step: u64) -> Result<SaveEvent> {
        let m = self.manifest(step)?;
        let mut snap = Snapshot::new(step)
            .with_epoch(m.epoch)
            .with_layout(m.world_size, m.layout.clone());
        for (k, v) in &m.meta {
            snap = snap.with_meta(k.clone(), v.clone());
        }
        for f in &m.files {
            let path = engine.root().join(format!(
                ".tmp-remote-{step}-{}-{}",
                std::process::id(),
                f.name
            ));
            let mut fetched = Ok(0);
            let durable = ckpt_core::write_durable_file(&path, |w| {
                fetched = self.fetch_part(&m, &f.name, w);
                Ok(())
            });
            let durable = match (fetched, durable) {
                (Ok(_), Ok(d)) => d,
                (Err(e), _) => {
                    let _ = std::fs::remove_file(&path);
                    return Err(e);
                }
                (Ok(_), Err(e)) => {
                    let _ = std::fs::remove_file(&path);
                    return Err(Error::Local {
                        step,
                        path,
                        source: e,
                    });
                }
            };
            snap = snap.with_adopted(f.name.clone(), durable);
        }
        engine.submit(snap)?;
        let events = engine.wait_idle()?;
        events
            .into_iter()
            .find(|e| e.step == step)
            .ok_or_else(|| Error::Gone(format!("step {step} was not published locally")))
    }
}

impl Remote {
    /// Restores the newest remote checkpoint newer than `newer_than` that fully verifies into
    /// the local root of `engine`, falling back past invalid or corrupt ones (each a warning,
    /// and listed in the result). None when no remote checkpoint is newer.
    pub fn restore_newest(
        &self,
        engine: &mut Engine,
        newer_than: Option<u64>,
    ) -> Result<Option<Restored>> {
        let mut skipped = Vec::new();
        let list = self.list()?;
        for c in list.iter().rev() {
            if newer_than.is_some_and(|n| c.step <= n) {
                break;
            }
            if let Some(reason) = &c.invalid {
                tracing::warn!(step = c.step, %reason, "remote checkpoint is invalid; trying an older one");
                skipped.push((c.step, reason.clone()));
                continue;
            }
            match self.restore_into(engine, c.step) {
                Ok(event) => {
                    return Ok(Some(Restored {
                        step: c.step,
                        event,
                        skipped,
                    }));
                }
                Err(e @ Error::Corrupt { .. }) => {
                    let reason = e.to_string();
                    tracing::warn!(step = c.step, %reason, "remote checkpoint is corrupt; trying an older one");
                    skipped.push((c.step, reason));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

/// The local file changed under the upload, or does not match its manifest.
fn check_local(
    step: u64,
    path: &Path,
    entry: &ckpt_core::layout::FileEntry,
    sent: u64,
    hasher: &Xxh3,
) -> Result<()> {
    let hex = format!("{:016x}", hasher.digest());
    if sent != entry.size || hex != entry.xxh3 {
        return Err(Error::Local {
            step,
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{sent} bytes with XXH3 {hex}, the manifest says {} bytes with {}",
                    entry.size, entry.xxh3
                ),
            ),
        });
    }
    Ok(())
}

/// A bandwidth cap: waits until `sent` bytes are within the budget since the start.
struct Throttle {
    rate: Option<u64>,
    start: Instant,
}

impl Throttle {
    fn new(rate: Option<u64>) -> Self {
        Self {
            rate,
            start: Instant::now(),
        }
    }

    async fn wait(&mut self, sent: u64) {
        let Some(rate) = self.rate.filter(|r| *r > 0) else {
            return;
        };
        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
        let elapsed = self.start.elapsed();
        if due > elapsed {
            tokio::time::sleep(due - elapsed).await;
        }
    }
}
