//! The built-in tables, listed once.
//!
//! Each entry says how a [`PipelineConfig`] asks for the table and builds it; the pipeline
//! builds every entry that is asked for, in this order (which is also the arena's layout
//! order: small, often-written buffers first, so a typical step's upload span is short), and
//! the declared columns after the entry named [`COLUMNS_AFTER`]. Nothing else in the core
//! names a built-in table.

use crate::allowed::AllowedTable;
use crate::bad_words::{BadWordsState, BadWordsTable};
use crate::error::{Error, Result};
use crate::limits::MAX_ELEMENTS;
use crate::logit_bias::LogitBiasTable;
use crate::min_p::MinPState;
use crate::min_tokens::{MinTokensState, MinTokensTable};
use crate::penalties::PenaltiesState;
use crate::pipeline::PipelineConfig;
use crate::processor::Table;
use crate::thinking::{ThinkingState, ThinkingTable};

/// The sizes every table is built with.
pub struct Sizing {
    pub capacity: usize,
    pub vocab_size: usize,
    /// Rows of the stable-slot front-end's row space (`None`: V1 only, no row-space copies).
    pub rows: Option<usize>,
    /// Draft tokens per request (0: no draft-row masks).
    pub spec_tokens: usize,
    /// Row-space rows per slot (stable slots), else 1.
    pub row_factor: usize,
}

impl Sizing {
    /// Checks a per-request cap against every buffer it sizes (`capacity × cap × rows or
    /// drafts`), naming `field` when the product is too large.
    pub fn check(&self, per_request: usize, field: &'static str) -> Result<usize> {
        let cap = self.capacity;
        let factor = self.row_factor.max(self.spec_tokens.max(1));
        cap.checked_mul(per_request.max(1))
            .and_then(|n| n.checked_mul(factor))
            .filter(|&n| n <= MAX_ELEMENTS)
            .map(|_| cap * per_request.max(1))
            .ok_or(Error::TooLarge {
                field,
                value: per_request,
                max: MAX_ELEMENTS / cap.max(1) / factor,
            })
    }

    /// Row-space triples for a per-request cap (stable slots only).
    fn row_space(&self, per_request: usize) -> Option<usize> {
        self.rows.map(|r| r * per_request)
    }

    /// Draft-row triples for a per-request cap (speculative decoding only).
    fn drafts(&self, per_request: usize) -> Option<usize> {
        (self.spec_tokens > 0).then(|| self.capacity * per_request * self.spec_tokens)
    }
}

/// One built-in: its name and how a config asks for it.
pub struct Builtin {
    pub name: &'static str,
    /// `None` when the config does not ask for this table.
    pub build: fn(&PipelineConfig, &Sizing) -> Option<Result<Box<dyn Table>>>,
}

/// The declared columns follow this entry.
pub const COLUMNS_AFTER: &str = "penalties";

fn boxed<T: Table>(t: Result<T>) -> Result<Box<dyn Table>> {
    t.map(|t| Box::new(t) as Box<dyn Table>)
}

pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "min_p",
        build: |cfg, s| cfg.min_p.then(|| boxed(MinPState::try_new(s.capacity))),
    },
    Builtin {
        name: "penalties",
        build: |cfg, s| {
            cfg.penalties.then(|| {
                let cap = s.capacity;
                PenaltiesState::try_new(cap, s.vocab_size, (4 * cap).max(16384)).map(|mut p| {
                    p.set_device_ops(!cfg.host_kernels);
                    Box::new(p) as Box<dyn Table>
                })
            })
        },
    },
    Builtin {
        name: "thinking",
        build: |cfg, s| {
            cfg.thinking.clone().map(|t| {
                let state = ThinkingState::new(s.capacity, s.vocab_size, t)?;
                boxed(ThinkingTable::try_new(state, s.row_space(1)))
            })
        },
    },
    Builtin {
        name: "min_tokens",
        build: |cfg, s| {
            cfg.min_tokens.map(|n| {
                s.check(n, "max_stop_token_ids")?;
                let state = MinTokensState::try_new(s.capacity, s.vocab_size, n)?;
                boxed(MinTokensTable::try_new(state, s.row_space(n), s.drafts(n)))
            })
        },
    },
    Builtin {
        name: "bad_words",
        build: |cfg, s| {
            cfg.bad_words.map(|(w, l)| {
                s.check(w, "max_bad_words")?;
                if l == 0 || l > MAX_ELEMENTS {
                    return Err(Error::TooLarge {
                        field: "max_bad_word_len",
                        value: l,
                        max: MAX_ELEMENTS,
                    });
                }
                let state = BadWordsState::try_new(s.capacity, s.vocab_size, w, l)?;
                boxed(BadWordsTable::try_new(state, s.row_space(w), s.drafts(w)))
            })
        },
    },
    Builtin {
        name: "logit_bias",
        build: |cfg, s| {
            cfg.logit_bias.map(|n| {
                s.check(n, "max_logit_bias_entries")?;
                boxed(LogitBiasTable::try_new(
                    s.capacity,
                    s.vocab_size,
                    n,
                    s.rows,
                ))
            })
        },
    },
    Builtin {
        name: "allowed",
        build: |cfg, s| {
            cfg.allowed.map(|n| {
                s.check(n, "max_allowed_token_ids")?;
                boxed(AllowedTable::try_new(s.capacity, s.vocab_size, n, s.rows))
            })
        },
    },
];
