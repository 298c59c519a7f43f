//! What a pipeline is built from: which tables, their stated caps, the engine-wide settings
//! the tables read. Its own module of `tables` (every table's `Build` reads it), so that the
//! pipeline depends on the tables and never the reverse.

use super::columns::ColumnSpec;
use super::thinking::ThinkingConfig;

/// Which tables a pipeline holds, with their stated caps.
#[derive(Clone, Debug, Default)]
pub struct PipelineConfig {
    /// Slots (`max_num_seqs`).
    pub capacity: usize,
    pub vocab_size: usize,
    /// The built-in tables to build, by registry name ([`crate::tables::BUILTINS`]).
    pub tables: Vec<String>,
    /// Per-request caps by engine-config name (`max_logit_bias_entries`, ...); a cap not
    /// given takes the registry's default.
    pub caps: Vec<(String, usize)>,
    /// The reasoning start and end ids (the thinking budget's engine-wide setting).
    pub thinking: Option<ThinkingConfig>,
    /// Draft tokens per request under speculative decoding (0: off).
    pub spec_tokens: usize,
    pub columns: Vec<ColumnSpec>,
    /// Keep row-space copies for the stable-slot front-end ([`crate::pipeline::Pipeline::map_rows`]).
    pub stable_slots: bool,
    /// Most logits rows a stable-slot step may map (default `capacity × (1 + spec_tokens)`).
    pub max_rows: Option<usize>,
    /// The processors apply on the host from the tables themselves (the CPU path): the
    /// penalties keep no device count matrix, so its row copies and additions are skipped.
    pub host_kernels: bool,
}

impl PipelineConfig {
    pub fn new(capacity: usize, vocab_size: usize) -> Self {
        PipelineConfig {
            capacity,
            vocab_size,
            ..PipelineConfig::default()
        }
    }

    /// Asks for the built-in table `name`.
    pub fn with(mut self, name: &str) -> Self {
        self.tables.push(name.to_string());
        self
    }

    /// Sets the per-request cap `name`.
    pub fn with_cap(mut self, name: &str, value: usize) -> Self {
        self.caps.retain(|(n, _)| n != name);
        self.caps.push((name.to_string(), value));
        self
    }

    /// The per-request cap `name`: as given, else the registry's default (0 if none).
    pub fn cap(&self, name: &str) -> usize {
        self.caps
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
            .or_else(|| super::default_cap(name))
            .unwrap_or(0)
    }
}

/// The highest draft position a stable-slot row may have: the configured speculative tokens,
/// or what the row space holds per slot beyond one row (`max_rows / capacity - 1`, rounded
/// up). Buffers sized per draft row (the penalties' cells) are sized by it.
pub fn max_draft_pos(spec_tokens: usize, row_factor: usize) -> usize {
    spec_tokens.max(row_factor.saturating_sub(1)).max(1)
}
