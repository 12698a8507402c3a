//! The snippets of `docs/reliability.md`.
