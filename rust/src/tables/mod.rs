//! The tables: one file per built-in processor, plus `columns` (the tables custom processors
//! declare), and the registry that lists the built-ins once. Each entry gives the table's name,
//! the per-request caps it is sized by (with their defaults), the request fields it reads,
//! where its buffers go in the arena, and how it is built. The pipeline, the bindings' field
//! reader and (through `_core.registry()`) the Python side derive everything about a built-in
//! from this list; nothing else in the core names one.

pub mod allowed;
pub mod bad_words;
pub mod columns;
mod config;
pub mod dry;
pub mod dry_breakers;
pub mod dry_matches;
pub mod epsilon_cutoff;
pub mod eta_cutoff;
pub mod float_params;
pub mod logit_bias;
pub mod min_p;
pub mod min_tokens;
pub mod no_repeat_ngram;
pub mod penalties;
pub mod thinking;
pub mod top_k_top_p;
pub mod top_n_sigma;
pub mod triples;
pub mod typical_p;
pub mod xtc;

use crate::error::{Error, Result};
use crate::fields::FieldSpec;
use crate::limits::MAX_ELEMENTS;
use crate::processor::Table;

pub use config::{max_draft_pos, PipelineConfig};

/// One built-in table.
pub struct Builtin {
    pub name: &'static str,
    /// Per-request caps (engine-config names) and their defaults.
    pub caps: &'static [(&'static str, usize)],
    /// The request fields it reads, in reading order.
    pub fields: &'static [FieldSpec],
    /// Whether a request it tracks has its output history read every step.
    pub history: bool,
    /// Its place in the arena: small, often-written buffers first, so a typical step's
    /// upload span is short. Declared columns take [`COLUMNS_LAYOUT`].
    pub layout: u8,
    pub build: fn(&Build<'_>) -> Result<Box<dyn Table>>,
    /// Its declaration, when it is one on the generic float-parameter table (the bindings'
    /// reader asks it whether the table keeps its requests' seeds).
    pub float_params: Option<&'static float_params::FloatParams>,
}

/// Declared columns' place in the arena (see [`Builtin::layout`]).
pub const COLUMNS_LAYOUT: u8 = 2;

/// What a table is built from: the pipeline's sizes and config.
pub struct Build<'a> {
    pub cfg: &'a PipelineConfig,
    pub capacity: usize,
    pub vocab_size: usize,
    /// Rows of the stable-slot front-end's row space (`None`: V1 only, no row-space copies).
    pub rows: Option<usize>,
    /// Draft tokens per request (0: no draft-row masks).
    pub spec_tokens: usize,
    /// Row-space rows per slot (stable slots), else 1.
    pub row_factor: usize,
}

impl Build<'_> {
    /// A per-request cap: the config's, else the registry's default; checked against every
    /// buffer it sizes (`capacity × cap × rows or drafts`), naming the cap when too large.
    pub fn cap(&self, name: &'static str) -> Result<usize> {
        let n = self.cfg.cap(name);
        self.check(n, name)?;
        Ok(n)
    }

    /// Checks a per-request size against every buffer it sizes.
    /// Too large with the rows (drafts or row space) but not without them: the error names
    /// what multiplies it, `num_speculative_tokens` or `max_rows`, not the cap.
    pub fn check(&self, per_request: usize, field: &'static str) -> Result<usize> {
        let cap = self.capacity;
        let factor = self.row_factor.max(self.spec_tokens.max(1));
        let fits = |factor: usize| {
            cap.checked_mul(per_request.max(1))
                .and_then(|n| n.checked_mul(factor))
                .is_some_and(|n| n <= MAX_ELEMENTS)
        };
        if fits(factor) {
            return Ok(cap * per_request.max(1));
        }
        if !fits(1) {
            return Err(Error::TooLarge {
                field,
                value: per_request,
                max: MAX_ELEMENTS / cap.max(1) / factor,
            });
        }
        // The largest factor that fits.
        let most = MAX_ELEMENTS / cap.max(1) / per_request.max(1);
        // The row space's size comes from the drafts unless max_rows was given.
        Err(
            if self.spec_tokens >= self.row_factor || self.cfg.max_rows.is_none() {
                Error::TooLarge {
                    field: "num_speculative_tokens",
                    value: self.spec_tokens,
                    // Without max_rows a request has `1 + drafts` rows (the factor), so one
                    // draft fewer than the factor fits; with it the factor is the drafts.
                    max: if self.cfg.max_rows.is_none() {
                        most.saturating_sub(1)
                    } else {
                        most
                    },
                }
            } else {
                Error::TooLarge {
                    field: "max_rows",
                    value: self.rows.unwrap_or(0),
                    max: most * cap,
                }
            },
        )
    }

    /// Row-space triples for a per-request cap (stable slots only).
    pub fn row_space(&self, per_request: usize) -> Option<usize> {
        self.rows.map(|r| r * per_request)
    }

    /// The highest draft position a stable-slot row may have (`local_pos`): the configured
    /// speculative tokens, or what the row space holds per slot beyond one row.
    pub fn max_draft_pos(&self) -> usize {
        max_draft_pos(self.spec_tokens, self.row_factor)
    }

    /// Draft-row triples for a per-request cap (speculative decoding only).
    pub fn drafts(&self, per_request: usize) -> Option<usize> {
        (self.spec_tokens > 0).then(|| self.capacity * per_request * self.spec_tokens)
    }
}

/// The default of a registered cap (`None`: no built-in declares it).
pub fn default_cap(name: &str) -> Option<usize> {
    BUILTINS
        .iter()
        .flat_map(|b| b.caps)
        .find(|(n, _)| *n == name)
        .map(|&(_, d)| d)
}

pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// The built-ins, in the order requests are read and checked (errors name the first bad
/// field in this order).
pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "min_p",
        caps: &[],
        fields: min_p::FIELDS,
        history: false,
        layout: 0,
        build: min_p::build,
        float_params: None,
    },
    Builtin {
        name: "logit_bias",
        caps: logit_bias::CAPS,
        fields: logit_bias::FIELDS,
        history: false,
        layout: 6,
        build: logit_bias::build,
        float_params: None,
    },
    Builtin {
        name: "min_tokens",
        caps: min_tokens::CAPS,
        fields: min_tokens::FIELDS,
        history: true,
        layout: 4,
        build: min_tokens::build,
        float_params: None,
    },
    Builtin {
        name: "penalties",
        caps: &[],
        fields: penalties::FIELDS,
        history: true,
        layout: 1,
        build: penalties::build,
        float_params: None,
    },
    Builtin {
        name: "bad_words",
        caps: bad_words::CAPS,
        fields: bad_words::FIELDS,
        history: true,
        layout: 5,
        build: bad_words::build,
        float_params: None,
    },
    Builtin {
        name: "allowed",
        caps: allowed::CAPS,
        fields: allowed::FIELDS,
        history: false,
        layout: 7,
        build: allowed::build,
        float_params: None,
    },
    Builtin {
        name: "no_repeat_ngram",
        caps: no_repeat_ngram::CAPS,
        fields: no_repeat_ngram::FIELDS,
        history: true,
        layout: 8,
        build: no_repeat_ngram::build,
        float_params: None,
    },
    Builtin {
        name: "dry",
        caps: dry::CAPS,
        fields: dry::FIELDS,
        history: true,
        layout: 13,
        build: dry::build,
        float_params: None,
    },
    Builtin {
        name: "thinking",
        caps: &[],
        fields: thinking::FIELDS,
        history: true,
        layout: 3,
        build: thinking::build,
        float_params: None,
    },
    Builtin {
        name: "top_n_sigma",
        caps: &[],
        fields: top_n_sigma::FIELDS,
        history: false,
        layout: 9,
        build: top_n_sigma::build,
        float_params: Some(&top_n_sigma::SPEC),
    },
    Builtin {
        name: "typical_p",
        caps: &[],
        fields: typical_p::FIELDS,
        history: false,
        layout: 10,
        build: typical_p::build,
        float_params: Some(&typical_p::SPEC),
    },
    Builtin {
        name: "epsilon_cutoff",
        caps: &[],
        fields: epsilon_cutoff::FIELDS,
        history: false,
        layout: 11,
        build: epsilon_cutoff::build,
        float_params: Some(&epsilon_cutoff::SPEC),
    },
    Builtin {
        name: "eta_cutoff",
        caps: &[],
        fields: eta_cutoff::FIELDS,
        history: false,
        layout: 12,
        build: eta_cutoff::build,
        float_params: Some(&eta_cutoff::SPEC),
    },
    Builtin {
        name: "xtc",
        caps: &[],
        fields: xtc::FIELDS,
        history: false,
        layout: 14,
        build: xtc::build,
        float_params: Some(&xtc::SPEC),
    },
    Builtin {
        name: "top_k_top_p",
        caps: &[],
        fields: top_k_top_p::FIELDS,
        history: false,
        layout: 15,
        build: top_k_top_p::build,
        float_params: Some(&top_k_top_p::SPEC),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::{End, FieldKind};

    /// Every declared range fits its field: an int range on an int field, a float range on a
    /// float field, and a cap end naming one of its table's caps.
    #[test]
    fn every_declared_range_fits_its_field() {
        for b in BUILTINS {
            for f in b.fields {
                let Some(r) = f.range else { continue };
                let int = matches!(f.kind, FieldKind::Int { .. } | FieldKind::OptInt);
                assert!(
                    int || matches!(f.kind, FieldKind::Float { .. }),
                    "{}",
                    f.name
                );
                assert_eq!(r.int, int, "{}", f.name);
                assert!(r.int || (r.hi != End::Unbounded && r.lo != End::Unbounded));
                assert!(
                    !matches!(r.lo, End::Cap(_)),
                    "{}: a cap is an upper end",
                    f.name
                );
                if let Some(cap) = r.cap() {
                    assert!(b.caps.iter().any(|(c, _)| *c == cap), "{}: {cap}", f.name);
                }
            }
        }
    }

    /// Every field declares examples, the first not neutral; each example of a number field
    /// is inside its range, each refused number outside it (the tests' value lists come from
    /// these: `registry.Field.examples`, `.bad`).
    #[test]
    fn every_field_has_examples_inside_and_bad_values_outside_its_range() {
        use crate::fields::Example;
        for b in BUILTINS {
            for f in b.fields {
                assert!(!f.examples.is_empty(), "{}: no example", f.name);
                let number = |e: &Example| match *e {
                    Example::Float(x) => Some(x),
                    Example::Int(n) => Some(n as f64),
                    _ => None,
                };
                let first = number(&f.examples[0]);
                match f.kind {
                    FieldKind::Float { neutral } => assert_ne!(first, Some(neutral), "{}", f.name),
                    FieldKind::Int { neutral } => {
                        assert_ne!(first, Some(neutral as f64), "{}", f.name)
                    }
                    _ => {}
                }
                let Some(r) = f.range else { continue };
                let refused = |x: f64| {
                    if r.int {
                        x.fract() != 0.0 || r.int_error(x as i64, None).is_some()
                    } else {
                        r.float_error(x).is_some()
                    }
                };
                for x in f.examples.iter().filter_map(number) {
                    assert!(!refused(x), "{}: example {x} refused", f.name);
                }
                for x in f.bad.iter().filter_map(number) {
                    assert!(refused(x), "{}: bad value {x} accepted", f.name);
                }
            }
        }
    }

    /// The draft bound a too-large cap's error states is the largest that fits: the bound
    /// itself passes, one more is refused (it stated one too many, "1024 is outside [1, 1024]").
    #[test]
    fn the_stated_draft_bound_is_the_largest_that_fits() {
        for (cap, per_request, max_rows) in [
            (256, 4096, None),
            (256, 1024, None),
            (7, 1000, None),
            (256, 1024, Some(256)),
            (5, 333, Some(5)),
        ] {
            let cfg = PipelineConfig {
                max_rows,
                stable_slots: max_rows.is_some(),
                ..PipelineConfig::new(cap, 100)
            };
            // As `Pipeline::new` sizes it: `max_rows`, else a request's `1 + drafts` rows.
            let build = |spec: usize| {
                let rows = max_rows.unwrap_or(cap * (spec + 1));
                Build {
                    cfg: &cfg,
                    capacity: cap,
                    vocab_size: 100,
                    rows: Some(rows),
                    spec_tokens: spec,
                    row_factor: rows.div_ceil(cap),
                }
            };
            let max = match build(1 << 20).check(per_request, "cap") {
                Err(Error::TooLarge {
                    field: "num_speculative_tokens",
                    max,
                    ..
                }) => max,
                other => panic!("{other:?}"),
            };
            assert!(build(max).check(per_request, "cap").is_ok(), "{max}");
            assert!(build(max + 1).check(per_request, "cap").is_err(), "{max}");
        }
    }
}
