//! The guide's library snippets (`docs/*.md`), verbatim, one module per page, each snippet inside
//! a function that gives it the values it uses, so `cargo test` (which builds every example)
//! proves they compile; `tests/docs.rs` checks every `rust` block of the guide is here. Not meant
//! to be run.

#![allow(dead_code, unused_variables, unused_imports)]

mod cli;
mod configuration;
mod custom_loop;
mod design;
mod learner;
mod memory_tier;
mod object_store;
mod performance;
mod preemption;
mod reliability;
mod resume;
mod zero_mpi;

fn main() {}
