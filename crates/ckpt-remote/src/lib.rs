//! `ckpt-remote`: an object-store tier behind the local checkpoint root.
//!
//! The local engine publishes each checkpoint first, as always, so the stall and a local
//! restore do not change. An [`Uploader`] then copies each published checkpoint to an
//! S3-compatible prefix in the background ([`Remote`], on Apache Arrow's `object_store`), with
//! its own bandwidth cap, concurrency and retention. A resume can fall back to the remote copy
//! when the local one is missing, older or invalid ([`Remote::restore_into`]).
//!
//! # Publication without rename
//! Object stores have no rename, so the local protocol cannot be ported; it is replaced by:
//!
//! 1. every part goes to `PREFIX/step-<step:08>/<name>`: one PUT when small, a multipart
//!    upload in `part_size` chunks otherwise. The bytes are hashed (XXH3) as they are read and
//!    must match the local manifest, or the upload is aborted;
//! 2. `PREFIX/step-<step:08>/manifest.json` (the local manifest's bytes) is written **last**,
//!    only after every part completed. A checkpoint exists only through a manifest whose
//!    listed parts all exist with their sizes ([`Remote::list`]) and checksums
//!    ([`Remote::verify`], and every restore);
//! 3. `PREFIX/latest` moves by a conditional put: create-only (`If-None-Match: *`) when
//!    absent, `If-Match` on the version just read otherwise, and never backwards. Of two
//!    writers racing on one prefix exactly one wins; the other gets [`Error::LostRace`];
//! 4. retention deletes only checkpoints older than the one `latest` names, each manifest
//!    first, so a checkpoint stops existing at once, then its parts.
//!
//! [`Remote::upload`] runs the protocol in one call. A sharded checkpoint splits it between
//! ranks with [`Remote::begin_upload`] (rank 0), [`Remote::upload_parts`] (every rank, its own
//! part) and [`Remote::commit_upload`] (rank 0, after every rank reported success; it checks
//! every listed part is in the store with its size before writing the manifest); ckpt-zero's
//! `upload` module does this over a collective.
//!
//! # Crash cases
//! - Interrupted during the parts (a failure, a crash, the server gone): no manifest, so
//!   nothing is published; a failed multipart upload is aborted. Parts left by a crash are
//!   unlisted garbage, which [`Remote::garbage_collect`] (`ckpt gc URL`) removes. A bucket
//!   lifecycle rule that aborts incomplete multipart uploads is still advisable.
//! - Interrupted after the manifest, before `latest`: the checkpoint is complete and listed;
//!   `latest` lags behind it until the next upload, and readers choose by listing.
//! - Interrupted during retention: a checkpoint without its manifest is already gone for
//!   readers; its parts are garbage for [`Remote::garbage_collect`].
//! - A replaced step (the local `with_replace`): its remote manifest is deleted before the new
//!   parts go up, so the old manifest never lists new parts.

mod completions;
mod error;
mod remote;
mod uploader;

pub use completions::Completions;
pub use error::{Error, Result};
pub use remote::{
    LatestPointer, Remote, RemoteCheckpoint, RemoteConfig, Restored, UploadPlan, Uploaded,
};
pub use uploader::{Uploader, stage};
