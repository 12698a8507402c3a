//! The snippets of `docs/performance.md`.
