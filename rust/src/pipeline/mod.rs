//! One core per pipeline: every table of a processor set, one update per step.
//!
//! A [`Pipeline`] owns the tables of the built-in processors it was configured with, plus the
//! columns custom processors declared, and the arena they upload through. One step:
//! 1. the update's shape is validated once;
//! 2. every added request's parameters (read once, into one [`RequestParams`]) are checked by
//!    every table, with checked arithmetic, before anything changes;
//! 3. only then is the update applied to every table, and the per-step work runs (output
//!    lengths, new tokens, bad-word matching, thinking budgets);
//! 4. what the tables wrote is staged for one upload ([`Pipeline::stage`]).
//!
//! A rejected update returns the first error and leaves every table exactly as it was. There is
//! no global state: two pipelines are independent.
//!
//! Two front-ends drive the same tables. **V1** (vLLM 0.25.1): [`BatchUpdate`]s with added,
//! removed and moved requests, rows = slots. **Stable slots** (vLLM's Model Runner V2):
//! [`Pipeline::add_request`] overwrites a slot, and each step gives a row → slot map
//! ([`Pipeline::map_rows`]) under which a slot may own several rows; the row-space copies of the
//! sparse tables are built on the host and go up with the step's one upload.

use crate::allowed::AllowedState;
use crate::arena::{Arena, HasBuffers, Staged, Upload};
use crate::bad_words::{BadWordsParams, BadWordsState};
use crate::batch::{BatchUpdate, Move};
use crate::buffer::HostBuffer;
use crate::columns::{Column, ColumnSpec, ColumnValue};
use crate::error::{Error, Result};
use crate::history::{HistoryId, HistorySource, HistoryStore};
use crate::limits::{check_sizes, MAX_ELEMENTS};
use crate::logit_bias::LogitBiasState;
use crate::min_p::MinPState;
use crate::min_tokens::{MinTokensParams, MinTokensState};
use crate::penalties::{PenaltiesState, PenaltyParams};
use crate::sparse::SparseRows;
use crate::table::SlotTable;
use crate::thinking::{ThinkingConfig, ThinkingParams, ThinkingState};

mod drafts;
mod outputs;
mod slots;

use outputs::OutputOps;
use slots::{padded_rows, RowSpace};

/// Which tables a pipeline holds, with their stated caps.
#[derive(Clone, Debug, Default)]
pub struct PipelineConfig {
    /// Slots (`max_num_seqs`).
    pub capacity: usize,
    pub vocab_size: usize,
    pub min_p: bool,
    /// LogitBias with at most this many entries per request.
    pub logit_bias: Option<usize>,
    /// MinTokens with at most this many stop ids per request.
    pub min_tokens: Option<usize>,
    pub penalties: bool,
    /// Bad words: (words per request, tokens per word).
    pub bad_words: Option<(usize, usize)>,
    /// Allowed token ids, at most this many per request.
    pub allowed: Option<usize>,
    pub thinking: Option<ThinkingConfig>,
    /// Draft tokens per request under speculative decoding (0: off).
    pub spec_tokens: usize,
    pub columns: Vec<ColumnSpec>,
    /// Keep row-space copies for the stable-slot front-end ([`Pipeline::map_rows`]).
    pub stable_slots: bool,
    /// Most logits rows a stable-slot step may map (default `capacity × (1 + spec_tokens)`).
    pub max_rows: Option<usize>,
    /// The processors apply on the host from the tables themselves (the CPU path): the
    /// penalties keep no device count matrix, so its row copies and additions are skipped.
    pub host_kernels: bool,
}

/// A new request's output so far, and where later tokens come from: `source` is the engine's
/// live list (re-read every step, see [`Pipeline::sync_sources`]), or `None` for the token
/// feed ([`Pipeline::step`]'s `feed`).
pub struct Output<S> {
    pub tokens: Vec<i64>,
    pub source: Option<S>,
}

impl<S> Output<S> {
    pub fn fed(tokens: Vec<i64>) -> Self {
        Output {
            tokens,
            source: None,
        }
    }
}

/// Everything any table reads from one added request, read once.
pub struct RequestParams<S> {
    pub min_p: f64,
    pub logit_bias: Vec<(i64, f64)>,
    pub min_tokens: i64,
    pub stop_token_ids: Vec<i64>,
    pub repetition_penalty: f64,
    pub frequency_penalty: f64,
    pub presence_penalty: f64,
    /// Prompt token ids (`None` for prompt-embeds requests).
    pub prompt: Option<Vec<i64>>,
    pub bad_words: Vec<Vec<i64>>,
    pub allowed_token_ids: Option<Vec<i64>>,
    pub thinking_budget: Option<i64>,
    /// One value per declared column, in declaration order.
    pub columns: Vec<ColumnValue>,
    pub output: Output<S>,
}

impl<S> RequestParams<S> {
    /// A request with every parameter at its neutral value.
    pub fn neutral(output: Output<S>) -> Self {
        RequestParams {
            min_p: 0.0,
            logit_bias: Vec::new(),
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            prompt: None,
            bad_words: Vec::new(),
            allowed_token_ids: None,
            thinking_budget: None,
            columns: Vec::new(),
            output,
        }
    }
}

/// The tables of one pipeline (what the arena lays out). Outputs are read through
/// [`HistoryId`]s into the pipeline's [`HistoryStore`].
pub struct Tables {
    pub min_p: Option<MinPState>,
    pub logit_bias: Option<LogitBiasState>,
    pub min_tokens: Option<MinTokensState<HistoryId>>,
    pub penalties: Option<PenaltiesState<HistoryId>>,
    pub bad_words: Option<BadWordsState<HistoryId>>,
    pub allowed: Option<AllowedState>,
    pub thinking: Option<ThinkingState<HistoryId>>,
    pub columns: Vec<Column>,
    /// Draft-row masks of MinTokens and bad words under speculative decoding.
    pub spec_min_tokens: Option<SparseRows<f32>>,
    pub spec_bad_words: Option<SparseRows<f32>>,
    rows: Option<RowSpace>,
}

impl HasBuffers for Tables {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        // Small, often-written buffers first, so a typical step's span is short.
        if let Some(t) = &mut self.min_p {
            t.visit_buffers(f);
        }
        if let Some(t) = &mut self.penalties {
            t.visit_buffers(f);
        }
        for c in &mut self.columns {
            c.visit_buffers(f);
        }
        if let Some(r) = &mut self.rows {
            f("rows.row_to_slot", &mut r.row_to_slot);
        }
        if let Some(t) = &mut self.thinking {
            t.visit_buffers(f);
        }
        if let Some(t) = &mut self.min_tokens {
            t.visit_buffers(f);
        }
        if let Some(t) = &mut self.bad_words {
            t.visit_buffers(f);
        }
        if let Some(t) = &mut self.logit_bias {
            t.visit_buffers(f);
        }
        if let Some(t) = &mut self.allowed {
            t.visit_buffers(f);
        }
        if let Some(r) = &mut self.rows {
            r.thinking.visit_as(
                [
                    "rows.thinking.rows",
                    "rows.thinking.cols",
                    "rows.thinking.vals",
                ],
                f,
            );
            r.min_tokens.visit_as(
                [
                    "rows.min_tokens.rows",
                    "rows.min_tokens.cols",
                    "rows.min_tokens.vals",
                ],
                f,
            );
            r.bad_words.visit_as(
                [
                    "rows.bad_words.rows",
                    "rows.bad_words.cols",
                    "rows.bad_words.vals",
                ],
                f,
            );
            r.logit_bias.visit_as(
                [
                    "rows.logit_bias.rows",
                    "rows.logit_bias.cols",
                    "rows.logit_bias.vals",
                ],
                f,
            );
            r.allowed.visit_as(
                [
                    "rows.allowed.rows",
                    "rows.allowed.cols",
                    "rows.allowed.vals",
                ],
                f,
            );
            f("rows.allowed.restricted_rows", &mut r.allowed_rows);
        }
        if let Some(t) = &mut self.spec_min_tokens {
            t.visit_as(
                [
                    "spec.min_tokens.rows",
                    "spec.min_tokens.cols",
                    "spec.min_tokens.vals",
                ],
                f,
            );
        }
        if let Some(t) = &mut self.spec_bad_words {
            t.visit_as(
                [
                    "spec.bad_words.rows",
                    "spec.bad_words.cols",
                    "spec.bad_words.vals",
                ],
                f,
            );
        }
    }
}

/// Checked payloads of one added request, one per enabled table.
struct Checked {
    min_p: f32,
    logit_bias: Option<Vec<(i32, f32)>>,
    min_tokens: Option<crate::min_tokens::Entry<HistoryId>>,
    penalties: Option<crate::penalties::Entry<HistoryId>>,
    bad_words: Option<crate::bad_words::Entry<HistoryId>>,
    allowed: Option<Vec<i32>>,
    thinking: Option<crate::thinking::Entry<HistoryId>>,
    columns: Vec<Option<crate::columns::Row>>,
    id: HistoryId,
}

/// One pipeline: its tables, its arena, the requests' output histories, and the batch it was
/// last given. `S` is where a list-fed history comes from (the bindings: a Python list).
pub struct Pipeline<S> {
    tables: Tables,
    arena: Arena,
    /// Each slot's history id (moves with its request, by the same rule as every table).
    outputs: SlotTable<HistoryId>,
    store: HistoryStore,
    /// By history id: the live source (list feed) and the first position still holding an
    /// async placeholder (`usize::MAX`: none), which the next sync re-reads from.
    sources: Vec<Option<S>>,
    unresolved: Vec<usize>,
    /// Histories with a source (none: nothing to sync).
    listed: usize,
    /// By history id: the sync that last read it (each is read once per sync).
    synced: Vec<u64>,
    sync_epoch: u64,
    capacity: usize,
    vocab_size: usize,
    spec_tokens: usize,
    batch_size: usize,
    steps: u64,
    /// Stable slots: checked changes waiting for the next step, in call order.
    pending: Vec<(usize, Option<Checked>)>,
}

impl<S: HistorySource> Pipeline<S> {
    /// Builds every configured table. Sizes are checked first (products of caps with checked
    /// arithmetic), so an impossible configuration is an error naming its field.
    pub fn new(cfg: PipelineConfig) -> Result<Self> {
        let cap = cfg.capacity;
        let spec = cfg.spec_tokens;
        let rows_cap = cfg.max_rows.unwrap_or(cap.saturating_mul(spec + 1));
        // Row-space buffers hold `rows_cap` rows: sized as a whole number of slot multiples.
        let row_factor = if cfg.stable_slots {
            rows_cap.div_ceil(cap.max(1)).max(1)
        } else {
            1
        };
        check_sizes(cap, cfg.vocab_size, &[row_factor])?;
        let sized = |per: usize, field: &'static str| -> Result<usize> {
            cap.checked_mul(per.max(1))
                .and_then(|n| n.checked_mul(row_factor.max(spec.max(1))))
                .filter(|&n| n <= MAX_ELEMENTS)
                .map(|_| cap * per.max(1))
                .ok_or(Error::TooLarge {
                    field,
                    value: per,
                    max: MAX_ELEMENTS / cap.max(1) / row_factor.max(spec.max(1)),
                })
        };
        let logit_bias = cfg
            .logit_bias
            .map(|n| sized(n, "max_logit_bias_entries").map(|_| n))
            .transpose()?;
        let min_tokens = cfg
            .min_tokens
            .map(|n| sized(n, "max_stop_token_ids").map(|_| n))
            .transpose()?;
        let bad_words = cfg
            .bad_words
            .map(|(w, l)| {
                sized(w, "max_bad_words")?;
                if l == 0 || l > MAX_ELEMENTS {
                    return Err(Error::TooLarge {
                        field: "max_bad_word_len",
                        value: l,
                        max: MAX_ELEMENTS,
                    });
                }
                Ok((w, l))
            })
            .transpose()?;
        let allowed = cfg
            .allowed
            .map(|n| sized(n, "max_allowed_token_ids").map(|_| n))
            .transpose()?;
        for c in &cfg.columns {
            sized(c.width(), "column width")?;
        }
        let v = cfg.vocab_size;
        let mut tables = Tables {
            min_p: cfg.min_p.then(|| MinPState::try_new(cap)).transpose()?,
            logit_bias: logit_bias
                .map(|n| LogitBiasState::try_new(cap, v, n))
                .transpose()?,
            min_tokens: min_tokens
                .map(|n| MinTokensState::try_new(cap, v, n))
                .transpose()?,
            penalties: cfg
                .penalties
                .then(|| PenaltiesState::try_new(cap, v, (4 * cap).max(16384)))
                .transpose()?,
            bad_words: bad_words
                .map(|(w, l)| BadWordsState::try_new(cap, v, w, l))
                .transpose()?,
            allowed: allowed
                .map(|n| AllowedState::try_new(cap, v, n))
                .transpose()?,
            thinking: cfg
                .thinking
                .map(|t| ThinkingState::new(cap, v, t))
                .transpose()?,
            columns: cfg
                .columns
                .into_iter()
                .map(|c| Column::new(c, cap, v))
                .collect::<Result<_>>()?,
            spec_min_tokens: min_tokens
                .filter(|_| spec > 0)
                .map(|n| SparseRows::try_new(cap * n * spec, "num_speculative_tokens"))
                .transpose()?,
            spec_bad_words: bad_words
                .filter(|_| spec > 0)
                .map(|(w, _)| SparseRows::try_new(cap * w * spec, "num_speculative_tokens"))
                .transpose()?,
            rows: None,
        };
        if cfg.stable_slots {
            let rows = rows_cap.max(1);
            let sz = |per: Option<usize>| per.map_or(1, |n| rows * n);
            tables.rows = Some(RowSpace {
                row_to_slot: HostBuffer::try_new(rows, 0, "row_to_slot")?,
                rows: 0,
                logit_bias: SparseRows::try_new(sz(logit_bias), "max_rows")?,
                min_tokens: SparseRows::try_new(sz(min_tokens), "max_rows")?,
                bad_words: SparseRows::try_new(sz(bad_words.map(|b| b.0)), "max_rows")?,
                allowed: SparseRows::try_new(sz(allowed), "max_rows")?,
                allowed_rows: HostBuffer::try_new(rows, 0, "row_to_slot")?,
                allowed_rows_len: 0,
                thinking: SparseRows::try_new(rows, "max_rows")?,
                map: Vec::new(),
            });
        }
        if let Some(p) = &mut tables.penalties {
            p.set_device_ops(!cfg.host_kernels);
        }
        let arena = Arena::new(&mut tables, "")?;
        let stable = cfg.stable_slots;
        Ok(Pipeline {
            tables,
            arena,
            outputs: SlotTable::new(cap),
            store: HistoryStore::default(),
            sources: Vec::new(),
            unresolved: Vec::new(),
            listed: 0,
            synced: Vec::new(),
            sync_epoch: 0,
            capacity: cap,
            vocab_size: v,
            spec_tokens: spec,
            batch_size: if stable { cap } else { 0 },
            steps: 0,
            pending: Vec::new(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Most logits rows one step may have (a feed, a row map): `capacity × (1 + spec_tokens)`,
    /// or the stable slots' row capacity when larger.
    pub fn max_rows(&self) -> usize {
        let rows = self.tables.rows.as_ref().map_or(0, |r| r.row_to_slot.len());
        self.capacity.saturating_mul(self.spec_tokens + 1).max(rows)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Steps applied since construction.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    pub fn arena_mut(&mut self) -> &mut Arena {
        &mut self.arena
    }

    /// Whether any table holds state (a step with nothing active can skip everything).
    fn any_active(&self) -> bool {
        let t = &self.tables;
        t.min_tokens.as_ref().is_some_and(|s| s.active() > 0)
            || t.penalties.as_ref().is_some_and(|s| s.active() > 0)
            || t.bad_words.as_ref().is_some_and(|s| s.active() > 0)
            || t.thinking.as_ref().is_some_and(|s| s.active() > 0)
    }

    /// Checks one added request against every table; nothing is written.
    fn check(
        &self,
        index: usize,
        p: RequestParams<S>,
        id: HistoryId,
        output_len: usize,
    ) -> Result<Checked> {
        let t = &self.tables;
        let min_p = if t.min_p.is_some() {
            MinPState::check(index, p.min_p)?
        } else {
            0.0
        };
        let logit_bias = match &t.logit_bias {
            Some(s) => s.check(index, p.logit_bias)?,
            None => None,
        };
        let min_tokens = match &t.min_tokens {
            Some(s) => s.check(
                index,
                MinTokensParams {
                    min_tokens: p.min_tokens,
                    stop_token_ids: p.stop_token_ids,
                    output: id,
                    output_len,
                },
            )?,
            None => None,
        };
        let penalties = match &t.penalties {
            Some(s) => s.check(
                index,
                PenaltyParams {
                    repetition_penalty: p.repetition_penalty,
                    frequency_penalty: p.frequency_penalty,
                    presence_penalty: p.presence_penalty,
                    prompt: p.prompt.clone(),
                    output: id,
                },
            )?,
            None => None,
        };
        let bad_words = match &t.bad_words {
            Some(s) => s.check(
                index,
                BadWordsParams {
                    words: p.bad_words,
                    output: id,
                },
            )?,
            None => None,
        };
        let allowed = match &t.allowed {
            Some(s) => s.check(index, p.allowed_token_ids)?,
            None => None,
        };
        let thinking = match &t.thinking {
            Some(s) => s.check(
                index,
                ThinkingParams {
                    budget: p.thinking_budget,
                    prompt: p.prompt,
                    output: id,
                },
            )?,
            None => None,
        };
        if p.columns.len() != t.columns.len() && !p.columns.is_empty() {
            return Err(Error::invalid(
                index,
                "column",
                format!(
                    "{} column values for {} declared columns",
                    p.columns.len(),
                    t.columns.len()
                ),
            ));
        }
        let mut values = p.columns.into_iter();
        let columns = t
            .columns
            .iter()
            .map(|c| c.check(index, values.next().unwrap_or(ColumnValue::Unset)))
            .collect::<Result<_>>()?;
        Ok(Checked {
            min_p,
            logit_bias,
            min_tokens,
            penalties,
            bad_words,
            allowed,
            thinking,
            columns,
            id,
        })
    }

    /// One V1 step: validates the whole update and every added request for every table, then
    /// applies it everywhere and runs the step's work.
    pub fn update(&mut self, update: BatchUpdate<RequestParams<S>>) -> Result<()> {
        self.step(Some(update), None)
    }

    fn commit(&mut self, u: BatchUpdate<Checked>) {
        let t = &mut self.tables;
        // Each table gets the same shape with its own payload; moving the payloads out once.
        let BatchUpdate {
            batch_size,
            removed,
            added,
            moved,
        } = u;
        let n = added.len();
        let mut min_p = Vec::with_capacity(n);
        let mut bias = Vec::with_capacity(n);
        let mut mt = Vec::with_capacity(n);
        let mut pen = Vec::with_capacity(n);
        let mut bw = Vec::with_capacity(n);
        let mut al = Vec::with_capacity(n);
        let mut th = Vec::with_capacity(n);
        let mut cols: Vec<Vec<_>> = (0..t.columns.len())
            .map(|_| Vec::with_capacity(n))
            .collect();
        let mut outs = Vec::with_capacity(n);
        for (i, c) in added {
            min_p.push((i, c.min_p));
            bias.push((i, c.logit_bias));
            mt.push((i, c.min_tokens));
            pen.push((i, c.penalties));
            bw.push((i, c.bad_words));
            al.push((i, c.allowed));
            th.push((i, c.thinking));
            for (k, row) in c.columns.into_iter().enumerate() {
                cols[k].push((i, row));
            }
            outs.push((i, c.id));
        }
        fn with<A>(
            bs: usize,
            removed: &[usize],
            moved: &[Move],
            added: Vec<(usize, A)>,
        ) -> BatchUpdate<A> {
            BatchUpdate {
                batch_size: bs,
                removed: removed.to_vec(),
                added,
                moved: moved.to_vec(),
            }
        }
        if let Some(s) = &mut t.min_p {
            s.commit(with(batch_size, &removed, &moved, min_p));
        }
        if let Some(s) = &mut t.logit_bias {
            s.commit(with(batch_size, &removed, &moved, bias));
        }
        // Histories displaced from their slot are released first: no table entry refers to
        // them after this step (every table follows the same rule), and the new requests'
        // histories were installed when they were checked.
        let mut ops = OutputOps {
            slots: &mut self.outputs,
            store: &mut self.store,
            sources: &mut self.sources,
            unresolved: &mut self.unresolved,
            listed: &mut self.listed,
        };
        with(batch_size, &removed, &moved, outs).replay(&mut ops, Some);
        let store = &self.store;
        if let Some(s) = &mut t.min_tokens {
            s.commit(with(batch_size, &removed, &moved, mt), store);
        }
        if let Some(s) = &mut t.penalties {
            s.commit(with(batch_size, &removed, &moved, pen), store);
        }
        if let Some(s) = &mut t.bad_words {
            s.commit(with(batch_size, &removed, &moved, bw), store);
        }
        if let Some(s) = &mut t.allowed {
            s.commit(with(batch_size, &removed, &moved, al));
        }
        if let Some(s) = &mut t.thinking {
            s.commit(with(batch_size, &removed, &moved, th));
            s.step(batch_size, store);
            s.sync_triples();
        }
        for (c, rows) in t.columns.iter_mut().zip(cols) {
            c.commit(with(batch_size, &removed, &moved, rows));
        }
        self.store.clear_rewritten();
        self.batch_size = batch_size;
        self.steps += 1;
    }

    /// A V1 step without a batch change: only the per-step work (new tokens, lengths).
    pub fn update_none(&mut self) -> Result<()> {
        self.sync_sources(false)?;
        self.work_none();
        Ok(())
    }

    fn work_none(&mut self) {
        self.steps += 1;
        if !self.any_active() {
            return;
        }
        let t = &mut self.tables;
        let store = &self.store;
        if let Some(s) = &mut t.min_tokens {
            s.update_none(store);
        }
        if let Some(s) = &mut t.penalties {
            s.update_none(store);
        }
        if let Some(s) = &mut t.bad_words {
            s.update_none(store);
        }
        if let Some(s) = &mut t.thinking {
            s.step(self.batch_size, store);
            s.sync_triples();
        }
        self.store.clear_rewritten();
    }

    /// Whether the last step stopped at an async placeholder (−1) in some output list: the
    /// caller should [`restep`](Self::restep) before applying, once the engine filled them in.
    pub fn saw_placeholders(&self) -> bool {
        let t = &self.tables;
        t.penalties.as_ref().is_some_and(|s| s.saw_placeholders())
            || t.bad_words.as_ref().is_some_and(|s| s.saw_placeholders())
            || t.thinking.as_ref().is_some_and(|s| s.saw_placeholders())
    }

    /// Looks again at the outputs of the tables that stopped at a placeholder.
    pub fn restep(&mut self) -> Result<()> {
        let bs = self.batch_size;
        self.sync_sources(true)?;
        let t = &mut self.tables;
        let store = &self.store;
        if let Some(s) = t.penalties.as_mut().filter(|s| s.saw_placeholders()) {
            s.update_none(store);
        }
        if let Some(s) = t.bad_words.as_mut().filter(|s| s.saw_placeholders()) {
            s.update_none(store);
        }
        if let Some(s) = t.thinking.as_mut().filter(|s| s.saw_placeholders()) {
            s.restep(bs, store);
            s.sync_triples();
        }
        self.store.clear_rewritten();
        Ok(())
    }

    /// One step, atomically: the token feed (if any) and the batch update (or none) are both
    /// checked before either changes anything. The feed comes first: `tokens[r]` was sampled
    /// for the row `r` of the previous step (before this step's update), or for slot
    /// `slots[r]` with a row map; −1 means the row got no token.
    pub fn step(
        &mut self,
        update: Option<BatchUpdate<RequestParams<S>>>,
        feed: Option<(&[i64], Option<&[usize]>)>,
    ) -> Result<()> {
        if let Some((tokens, slots)) = feed {
            self.check_feed(tokens, slots)?;
        }
        let checked = match update {
            Some(u) => {
                u.validate(self.capacity)?;
                let mut admitted = Vec::new();
                let checked = u.try_map_added(|i, p| {
                    let c = self.admit(i, p)?;
                    admitted.push(c.id);
                    Ok(c)
                });
                match checked {
                    Ok(c) => Some(c),
                    Err(e) => {
                        for id in admitted {
                            self.uninstall(id);
                        }
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        if let Err(e) = self.sync_sources(false) {
            if let Some(c) = checked {
                for (_, entry) in c.added {
                    self.uninstall(entry.id);
                }
            }
            return Err(e);
        }
        if let Some((tokens, slots)) = feed {
            self.push_feed(tokens, slots);
        }
        let fed = feed.is_some_and(|(t, _)| t.iter().any(|&x| x >= 0));
        match checked {
            Some(c) => self.commit(c),
            // No update, no new token and no list to re-read: nothing can have changed.
            None if !fed && self.listed == 0 => self.steps += 1,
            None => self.work_none(),
        }
        Ok(())
    }

    /// Stages what the tables wrote since the last stage into staging copy `k`; returns the
    /// upload to make (see [`Arena::stage`]).
    pub fn stage(&mut self, k: usize, all: bool) -> Result<Option<Upload>> {
        self.arena.stage(&mut self.tables, k, all)
    }

    /// Forgets what was written (CPU zero-copy path), counting it as an upload would.
    pub fn discard(&mut self) {
        self.arena.discard(&mut self.tables);
    }

    /// Numbers the Python side reads after a step (see [`Status`]).
    pub fn status(&self) -> Status {
        let t = &self.tables;
        let padded = |s: Option<&SparseRows<f32>>| s.map_or(0, SparseRows::padded_len);
        let rows = t.rows.as_ref();
        Status {
            batch_size: self.batch_size,
            min_p_count: t.min_p.as_ref().map_or(0, MinPState::count),
            logit_bias: padded(t.logit_bias.as_ref().map(|s| s.triples())),
            min_tokens: padded(t.min_tokens.as_ref().map(|s| s.triples())),
            bad_words: padded(t.bad_words.as_ref().map(|s| s.triples())),
            allowed: padded(t.allowed.as_ref().map(|s| s.pairs())),
            allowed_rows: t.allowed.as_ref().map_or(0, AllowedState::padded_rows),
            thinking: padded(t.thinking.as_ref().map(|s| s.triples())),
            penalties: t.penalties.as_ref().map_or(0, |s| s.active()),
            placeholders: self.saw_placeholders(),
            rows: rows.map_or(0, |r| r.rows),
            row_logit_bias: padded(rows.map(|r| &r.logit_bias)),
            row_min_tokens: padded(rows.map(|r| &r.min_tokens)),
            row_bad_words: padded(rows.map(|r| &r.bad_words)),
            row_allowed: padded(rows.map(|r| &r.allowed)),
            row_allowed_rows: rows
                .map_or(0, |r| padded_rows(r.allowed_rows_len, r.allowed_rows.len())),
            row_thinking: padded(rows.map(|r| &r.thinking)),
            stepping: self.any_active(),
            columns_active: t.columns.iter().map(Column::active).collect(),
        }
    }

    pub fn tables_mut(&mut self) -> &mut Tables {
        &mut self.tables
    }
}

/// What a step left for the device side to read: lengths of the exported triples (padded) and
/// the counts it skips work by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub batch_size: usize,
    pub min_p_count: usize,
    pub logit_bias: usize,
    pub min_tokens: usize,
    pub bad_words: usize,
    pub allowed: usize,
    pub allowed_rows: usize,
    pub thinking: usize,
    pub penalties: usize,
    pub placeholders: bool,
    pub rows: usize,
    pub row_logit_bias: usize,
    pub row_min_tokens: usize,
    pub row_bad_words: usize,
    pub row_allowed: usize,
    pub row_allowed_rows: usize,
    pub row_thinking: usize,
    /// Whether some table holds state that a step must advance even without a batch change
    /// (min-tokens lengths, penalties counts, bad-word prefixes, thinking budgets). When it is
    /// false and nothing is applied, a step without an update has nothing to do.
    pub stepping: bool,
    pub columns_active: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;
    use crate::history::SharedHistory;

    fn pipeline(stable: bool, token_feed_cap: usize) -> Pipeline<SharedHistory> {
        Pipeline::new(PipelineConfig {
            capacity: 4,
            vocab_size: 16,
            min_p: true,
            logit_bias: Some(4),
            min_tokens: Some(4),
            penalties: true,
            bad_words: Some((4, 4)),
            allowed: Some(8),
            thinking: Some(ThinkingConfig {
                start_ids: vec![1],
                end_ids: vec![2],
            }),
            stable_slots: stable,
            max_rows: Some(token_feed_cap),
            ..PipelineConfig::default()
        })
        .unwrap()
    }

    fn req() -> RequestParams<SharedHistory> {
        let mut p = RequestParams::neutral(Output::fed(Vec::new()));
        p.min_p = 0.5;
        p.logit_bias = vec![(3, 1.0)];
        p.min_tokens = 5;
        p.stop_token_ids = vec![4];
        p.repetition_penalty = 1.5;
        p.bad_words = vec![vec![5, 6]];
        p.allowed_token_ids = Some(vec![3, 4, 6]);
        p.thinking_budget = Some(3);
        p.prompt = Some(vec![1, 7]);
        p
    }

    fn snapshot(p: &Pipeline<SharedHistory>) -> (Status, Vec<Vec<u8>>) {
        let bufs = p
            .arena()
            .sections()
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let src = p.arena().source(i).unwrap();
                // SAFETY: test-only read of `bytes` bytes inside the section's buffer.
                unsafe { std::slice::from_raw_parts(src.as_ptr(), s.bytes).to_vec() }
            })
            .collect();
        (p.status(), bufs)
    }

    #[test]
    fn one_bad_field_rejects_the_whole_step_for_every_table() {
        let mut p = pipeline(false, 4);
        let mut u = BatchUpdate::new(2);
        u.added = vec![(0, req())];
        p.update(u).unwrap();
        let before = snapshot(&p);
        for bad in 0..6 {
            let mut r = req();
            match bad {
                0 => r.min_p = 2.0,
                1 => r.logit_bias = vec![(16, 1.0)],
                2 => r.stop_token_ids = vec![99],
                3 => r.repetition_penalty = f64::NAN,
                4 => r.bad_words = vec![vec![]],
                _ => r.thinking_budget = Some(-7),
            }
            let mut u = BatchUpdate::new(3);
            u.added = vec![(1, req()), (2, r)];
            u.moved = vec![Move::swap(0, 1)];
            let e = p.update(u).unwrap_err().to_string();
            assert!(e.contains("index 2"), "{e}");
            assert_eq!(snapshot(&p), before, "case {bad}");
        }
    }

    #[test]
    fn a_bad_token_feed_stops_the_update_too() {
        let mut p = Pipeline::new(PipelineConfig {
            capacity: 4,
            vocab_size: 16,
            penalties: true,
            ..PipelineConfig::default()
        })
        .unwrap();
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, req())];
        p.step(Some(u), None).unwrap();
        let mut u = BatchUpdate::new(2);
        u.added = vec![(1, req())];
        assert!(p.step(Some(u), Some((&[3, 16], None))).is_err());
        assert_eq!(p.batch_size(), 1);
        assert_eq!(p.history(0), Some(&[][..]));
        p.step(None, Some((&[3], None))).unwrap();
        assert_eq!(p.history(0), Some(&[3][..]));
        assert_eq!(
            p.tables().penalties.as_ref().unwrap().counted(0),
            Some(&[3][..])
        );
    }

    #[test]
    fn stable_slots_apply_changes_at_the_step_in_call_order() {
        let mut p = pipeline(true, 8);
        p.add_request(2, req()).unwrap();
        p.remove_request(2).unwrap();
        p.add_request(3, req()).unwrap();
        let mut bad = req();
        bad.min_p = -1.0;
        assert!(p.add_request(1, bad).is_err());
        assert_eq!(p.tables().logit_bias.as_ref().unwrap().active(), 0);
        p.step_slots(&[3, 3, 0], None).unwrap();
        let bias = p.tables().logit_bias.as_ref().unwrap();
        assert_eq!((bias.get(2), bias.get(3).is_some()), (None, true));
        let s = p.status();
        assert_eq!(s.rows, 3);
        // Slot 3's bias lands on rows 0 and 1, none on row 2 (slot 0 is empty).
        let rs = p.tables.rows.as_ref().unwrap();
        assert_eq!(rs.logit_bias.triples(), vec![(0, 3, 1.0), (1, 3, 1.0)]);
        assert!(p.step_slots(&[9], None).is_err());
    }

    #[test]
    fn an_unchanged_step_uploads_nothing() {
        let mut p = pipeline(false, 4);
        let mut u = BatchUpdate::new(1);
        u.added = vec![(0, req())];
        p.update(u).unwrap();
        assert!(p.stage(0, false).unwrap().is_some());
        p.update_none().unwrap();
        assert_eq!(p.stage(1, false).unwrap(), None);
        assert_eq!(p.arena().last_upload_bytes(), 0);
    }
}
