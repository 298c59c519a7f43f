//! `logitsproc_rs`: the per-request state behind an LLM sampler's logits processors.
//!
//! The crate is pure Rust. It keeps fixed-capacity per-slot tables (one slot per row of the
//! persistent batch), applies each [`BatchUpdate`] to them in one call with vLLM 0.25.1's
//! semantics, tracks what changed, and keeps page-aligned host buffers that Python reads
//! zero-copy through DLPack. The PyO3 bindings live in [`python`] behind the `python` feature,
//! so `cargo test` and `cargo bench` need no interpreter.

pub mod arena;
pub mod batch;
pub mod buffer;
pub mod dlpack;
pub mod error;
pub mod fields;
pub mod history;
pub mod host_apply;
pub mod limits;
pub mod pipeline;
pub mod processor;
pub mod row_space;
pub mod sampling;
pub mod sparse;
pub mod table;
pub mod tables;

#[cfg(feature = "python")]
mod python;

pub use batch::{BatchUpdate, BatchUpdateBuilder, Move, MoveDirectionality};
pub use error::{Error, ErrorKind, Result};
