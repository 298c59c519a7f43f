//! `logitsproc_rs`: the per-request state behind an LLM sampler's logits processors.
//!
//! The crate is pure Rust. It keeps fixed-capacity per-slot tables (one slot per row of the
//! persistent batch), applies each [`BatchUpdate`] to them in one call with vLLM 0.25.1's
//! semantics, tracks what changed, and keeps page-aligned host buffers that Python reads
//! zero-copy through DLPack. The PyO3 bindings live in [`python`] behind the `python` feature,
//! so `cargo test` and `cargo bench` need no interpreter.

pub mod allowed;
pub mod arena;
pub mod bad_words;
pub mod batch;
pub mod buffer;
pub mod columns;
pub mod dlpack;
pub mod error;
pub mod history;
pub mod host_apply;
pub mod limits;
pub mod logit_bias;
pub mod min_p;
pub mod min_tokens;
pub mod penalties;
pub mod pipeline;
pub mod sparse;
pub mod table;
pub mod thinking;

#[cfg(feature = "python")]
mod python;

pub use batch::{BatchUpdate, BatchUpdateBuilder, Move, MoveDirectionality};
pub use error::{Error, ErrorKind, Result};
