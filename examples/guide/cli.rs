//! The snippets of `docs/cli.md`.
