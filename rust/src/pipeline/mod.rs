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

use std::any::Any;
use std::ops::{Deref, DerefMut};

use crate::arena::{Arena, HasBuffers, Staged, Upload};
use crate::batch::{BatchUpdate, Move};
use crate::error::{Error, Result};
use crate::fields::{FieldSpec, Fields};
use crate::history::{HistoryId, HistorySource, HistoryStore};
use crate::limits::{check_sizes, MAX_ELEMENTS};
use crate::processor::{Admission, Entry, StepContext, Table};
use crate::table::SlotTable;
use crate::tables::columns::{Column, ColumnTable};
use crate::tables::{builtin, Build, BUILTINS, COLUMNS_LAYOUT};

mod builtins;
mod draft_replay;
mod drafts;
mod outputs;
mod slots;

pub use crate::tables::penalties::PROMPT_FLAG;
pub use crate::tables::thinking::ThinkingConfig;
pub use crate::tables::{max_draft_pos, PipelineConfig};
pub use draft_replay::Drafts;
use outputs::OutputOps;
use slots::RowSpace;

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

/// One added request: its fields and its output.
pub struct RequestParams<S> {
    pub fields: Fields,
    pub output: Output<S>,
}

impl<S> RequestParams<S> {
    /// A request with every parameter at its neutral value.
    pub fn neutral(output: Output<S>) -> Self {
        RequestParams {
            fields: Fields::default(),
            output,
        }
    }
}

impl<S> Deref for RequestParams<S> {
    type Target = Fields;

    fn deref(&self) -> &Fields {
        &self.fields
    }
}

impl<S> DerefMut for RequestParams<S> {
    fn deref_mut(&mut self) -> &mut Fields {
        &mut self.fields
    }
}

/// The tables of one pipeline, in layout order, and the stable slots' row map (what the
/// arena lays out).
pub struct Tables {
    /// In the order requests are checked.
    list: Vec<Box<dyn Table>>,
    /// Indices into `list` in arena layout order.
    layout: Vec<usize>,
    rows: Option<RowSpace>,
}

impl HasBuffers for Tables {
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
        for &k in &self.layout {
            self.list[k].visit_buffers(f);
        }
        if let Some(r) = &mut self.rows {
            f("rows.row_to_slot", &mut r.row_to_slot);
            f("rows.draft_pos", &mut r.draft_pos);
            f("rows.drafts", &mut r.drafts_before);
        }
        for &k in &self.layout {
            if let Some(r) = self.list[k].rows_mut() {
                r.visit_late_buffers(f);
            }
        }
    }
}

impl Tables {
    /// Every table, in layout order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Table> {
        self.list.iter().map(|t| t.as_ref())
    }

    /// The first table of type `T`, if the pipeline has one.
    pub fn get<T: Table>(&self) -> Option<&T> {
        self.list
            .iter()
            .find_map(|t| (t.as_ref() as &dyn Any).downcast_ref::<T>())
    }

    pub fn get_mut<T: Table>(&mut self) -> Option<&mut T> {
        self.list
            .iter_mut()
            .find_map(|t| (t.as_mut() as &mut dyn Any).downcast_mut::<T>())
    }

    /// The table named `name`, if the pipeline has one.
    pub fn named(&self, name: &str) -> Option<&dyn Table> {
        self.iter().find(|t| t.name() == name)
    }
}

/// Checked payloads of one added request, one per table, and its history.
struct Checked {
    entries: Vec<Entry>,
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
    columns: usize,
    /// The request fields the tables read, in reading order.
    fields: Vec<FieldSpec>,
    /// Stable slots: checked changes waiting for the next step, in call order.
    pending: Vec<(usize, Option<Checked>)>,
    /// A V1 step checked by [`prepare`](Pipeline::prepare), not applied yet.
    prepared: Option<Prepared>,
    /// A prepared step was aborted after its sync, or a sync was refused: the next sync keeps
    /// the rewrite marks it left (no table has seen them yet).
    rewrites_kept: bool,
}

/// A checked V1 step waiting for [`Pipeline::commit_prepared`]: the checked update (its new
/// requests' histories installed) and the token feed.
struct Prepared {
    checked: Option<BatchUpdate<Checked>>,
    feed: Option<(Vec<i64>, Option<Vec<usize>>)>,
}

/// The sizes every row-sized buffer derives from, each named when it is too large: the
/// capacity and vocabulary, the draft rows per request (`num_speculative_tokens`: `capacity ×
/// (1 + drafts)` rows) and the stable slots' `max_rows` (at least one row).
fn check_rows(cap: usize, vocab: usize, spec: usize, max_rows: Option<usize>) -> Result<()> {
    check_sizes(cap, vocab, &[])?;
    let most = MAX_ELEMENTS / cap;
    if spec >= most {
        return Err(Error::TooLarge {
            field: "num_speculative_tokens",
            value: spec,
            max: most - 1,
        });
    }
    match max_rows {
        Some(rows) if rows == 0 || rows > MAX_ELEMENTS => Err(Error::TooLarge {
            field: "max_rows",
            value: rows,
            max: MAX_ELEMENTS,
        }),
        _ => Ok(()),
    }
}

impl<S: HistorySource> Pipeline<S> {
    /// Builds every configured table. Sizes are checked first (products of caps with checked
    /// arithmetic), so an impossible configuration is an error naming its field.
    pub fn new(cfg: PipelineConfig) -> Result<Self> {
        let cap = cfg.capacity;
        let spec = cfg.spec_tokens;
        check_rows(cap, cfg.vocab_size, spec, cfg.max_rows)?;
        let rows_cap = cfg.max_rows.unwrap_or(cap.saturating_mul(spec + 1));
        // Row-space buffers hold `rows_cap` rows: sized as a whole number of slot multiples.
        // Stable slots map rows to slots every step; a V1 pipeline under speculative decoding
        // maps its draft rows (a request's rows at their draft positions) the same way.
        let row_space = cfg.stable_slots || spec > 0;
        let row_factor = if row_space {
            rows_cap.div_ceil(cap.max(1)).max(1)
        } else {
            1
        };
        check_sizes(cap, cfg.vocab_size, &[row_factor])?;
        let v = cfg.vocab_size;
        let build = Build {
            cfg: &cfg,
            capacity: cap,
            vocab_size: v,
            rows: row_space.then_some(rows_cap.max(1)),
            spec_tokens: spec,
            row_factor,
        };
        if let Some(t) = cfg.tables.iter().find(|t| builtin(t).is_none()) {
            return Err(Error::Config {
                field: "tables",
                message: format!("unknown table {t:?}"),
            });
        }
        let mut list: Vec<Box<dyn Table>> = Vec::new();
        let mut ranks = Vec::new();
        let mut fields = Vec::new();
        for b in BUILTINS {
            if cfg.tables.iter().any(|t| t == b.name) {
                list.push((b.build)(&build)?);
                ranks.push(b.layout);
                fields.extend_from_slice(b.fields);
            }
        }
        for c in &cfg.columns {
            build.check(c.width(), "column width")?;
        }
        for (k, c) in cfg.columns.iter().enumerate() {
            let col = Column::new(c.clone(), cap, v)?;
            list.push(Box::new(ColumnTable::new(col, k)));
            ranks.push(COLUMNS_LAYOUT);
        }
        let mut layout: Vec<usize> = (0..list.len()).collect();
        layout.sort_by_key(|&k| ranks[k]);
        let rows = row_space
            .then(|| RowSpace::try_new(rows_cap.max(1), max_draft_pos(spec, row_factor)))
            .transpose()?;
        let mut tables = Tables { list, layout, rows };
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
            columns: cfg.columns.len(),
            fields,
            pending: Vec::new(),
            prepared: None,
            rewrites_kept: false,
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

    /// The request fields this pipeline's tables read, in reading order.
    pub fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    /// Whether some table reads the prompt of a request with these fields.
    pub fn wants_prompt(&self, fields: &Fields) -> bool {
        self.tables
            .list
            .iter()
            .any(|t| t.history().is_some_and(|h| h.wants_prompt(fields)))
    }

    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    pub fn tables_mut(&mut self) -> &mut Tables {
        &mut self.tables
    }

    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    pub fn arena_mut(&mut self) -> &mut Arena {
        &mut self.arena
    }

    /// Whether any table holds state a step must advance (a step with nothing active can
    /// skip everything): a table that reads histories with a request it tracks.
    fn any_active(&self) -> bool {
        self.tables
            .list
            .iter()
            .any(|t| t.history().is_some() && t.active().is_some_and(|n| n > 0))
    }

    /// Checks one added request against every table; nothing is written.
    fn check(
        &self,
        index: usize,
        mut p: RequestParams<S>,
        id: HistoryId,
        output_len: usize,
    ) -> Result<Checked> {
        if p.columns.len() != self.columns && !p.columns.is_empty() {
            return Err(Error::invalid(
                index,
                "column",
                format!(
                    "{} column values for {} declared columns",
                    p.columns.len(),
                    self.columns
                ),
            ));
        }
        let admission = Admission {
            history: id,
            output_len,
        };
        let entries = self
            .tables
            .list
            .iter()
            .map(|t| t.check(index, &mut p.fields, admission))
            .collect::<Result<_>>()?;
        Ok(Checked { entries, id })
    }

    /// Whether a checked request has an entry in some table that reads its output.
    fn reads_output(&self, c: &Checked) -> bool {
        self.tables
            .list
            .iter()
            .zip(&c.entries)
            .any(|(t, e)| e.is_some() && t.history().is_some())
    }

    /// One V1 step: validates the whole update and every added request for every table, then
    /// applies it everywhere and runs the step's work.
    pub fn update(&mut self, update: BatchUpdate<RequestParams<S>>) -> Result<()> {
        self.step(Some(update), None)
    }

    fn commit(&mut self, u: BatchUpdate<Checked>) {
        let BatchUpdate {
            batch_size,
            removed,
            added,
            moved,
        } = u;
        let n_tables = self.tables.list.len();
        // Each table gets the same shape with its own payload; the payloads move out once.
        let mut per_table: Vec<Vec<(usize, Entry)>> = (0..n_tables)
            .map(|_| Vec::with_capacity(added.len()))
            .collect();
        let mut outs = Vec::with_capacity(added.len());
        for (i, c) in added {
            for (k, e) in c.entries.into_iter().enumerate() {
                per_table[k].push((i, e));
            }
            outs.push((i, c.id));
        }
        fn with<A>(
            batch_size: usize,
            removed: &[usize],
            moved: &[Move],
            added: Vec<(usize, A)>,
        ) -> BatchUpdate<A> {
            BatchUpdate {
                batch_size,
                removed: removed.to_vec(),
                added,
                moved: moved.to_vec(),
            }
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
        let ctx = StepContext {
            batch_size,
            store: &self.store,
            capacity: self.capacity,
        };
        for (t, added) in self.tables.list.iter_mut().zip(per_table) {
            t.commit(with(batch_size, &removed, &moved, added), &ctx);
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
        let ctx = StepContext {
            batch_size: self.batch_size,
            store: &self.store,
            capacity: self.capacity,
        };
        for t in &mut self.tables.list {
            t.step(&ctx);
        }
        self.store.clear_rewritten();
    }

    /// Whether the last step stopped at an async placeholder (−1) in some output list: the
    /// caller should [`restep`](Self::restep) before applying, once the engine filled them in.
    pub fn saw_placeholders(&self) -> bool {
        self.tables
            .list
            .iter()
            .any(|t| t.history().is_some_and(|h| h.saw_placeholders()))
    }

    /// Looks again at the outputs of the tables that stopped at a placeholder.
    pub fn restep(&mut self) -> Result<()> {
        self.sync_sources(true)?;
        let ctx = StepContext {
            batch_size: self.batch_size,
            store: &self.store,
            capacity: self.capacity,
        };
        for h in self.tables.list.iter_mut().filter_map(|t| t.history_mut()) {
            h.restep(&ctx);
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
        let checked = self.check_step(update, feed)?;
        self.apply_step(checked, feed);
        Ok(())
    }

    /// The first half of [`step`](Self::step), for a step over several pipelines that must
    /// all accept it before any changes: everything is read and checked (the new requests'
    /// histories are installed, invisible to every table), nothing a table holds changes.
    /// Then [`commit_prepared`](Self::commit_prepared) applies it, or
    /// [`abort_prepared`](Self::abort_prepared) drops it. A second `prepare` (or a `step`)
    /// while one is pending is a protocol error.
    pub fn prepare(
        &mut self,
        update: Option<BatchUpdate<RequestParams<S>>>,
        feed: Option<(Vec<i64>, Option<Vec<usize>>)>,
    ) -> Result<()> {
        let borrowed = feed.as_ref().map(|(t, s)| (t.as_slice(), s.as_deref()));
        let checked = self.check_step(update, borrowed)?;
        self.prepared = Some(Prepared { checked, feed });
        Ok(())
    }

    /// Applies the step [`prepare`](Self::prepare) checked (a protocol error if none is).
    pub fn commit_prepared(&mut self) -> Result<()> {
        let Some(Prepared { checked, feed }) = self.prepared.take() else {
            return Err(Error::Protocol("no prepared step to commit".into()));
        };
        let borrowed = feed.as_ref().map(|(t, s)| (t.as_slice(), s.as_deref()));
        self.apply_step(checked, borrowed);
        Ok(())
    }

    /// Drops the step [`prepare`](Self::prepare) checked: every table as before it (the new
    /// requests' histories are released). Nothing to do if none is pending.
    pub fn abort_prepared(&mut self) {
        if let Some(Prepared {
            checked: Some(c), ..
        }) = self.prepared.take()
        {
            for (_, entry) in c.added {
                self.uninstall(entry.id);
            }
        }
        // Its sync brought the copies up to date: what it found rewritten stays marked for
        // the tables, which have not read it.
        self.rewrites_kept = true;
    }

    /// Whether a prepared step waits for its commit.
    pub fn has_prepared(&self) -> bool {
        self.prepared.is_some()
    }

    /// Checks a step (the feed, the update, every added request against every table) and
    /// brings the histories up to date; on an error nothing is left behind.
    fn check_step(
        &mut self,
        update: Option<BatchUpdate<RequestParams<S>>>,
        feed: Option<(&[i64], Option<&[usize]>)>,
    ) -> Result<Option<BatchUpdate<Checked>>> {
        if self.prepared.is_some() {
            return Err(Error::Protocol(
                "a prepared step is pending: commit or abort it first".into(),
            ));
        }
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
        Ok(checked)
    }

    /// Applies a checked step: the feed, then the update (or only the per-step work).
    fn apply_step(
        &mut self,
        checked: Option<BatchUpdate<Checked>>,
        feed: Option<(&[i64], Option<&[usize]>)>,
    ) {
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

    /// The names of [`status_into`](Self::status_into)'s values, in order (fixed for the
    /// pipeline's life): the two sizes `batch_size` and `rows` (the stable slots' mapped rows),
    /// then each table's own counts (`min_p`, `logit_bias`, `rows.logit_bias`, ...; a column's
    /// is `column.<k>`), `placeholders` and `stepping`: every entry after the sizes is work.
    pub fn status_names(&self) -> Vec<String> {
        let mut names = vec!["batch_size".to_string(), "rows".to_string()];
        for t in &self.tables.list {
            t.status(&mut |name, _| names.push(name.to_string()));
        }
        names.extend(["placeholders", "stepping"].map(String::from));
        names
    }

    /// Writes what a step left for the device side to read (lengths of the exported triples,
    /// padded, and the counts it skips work by) into `out`, in
    /// [`status_names`](Self::status_names)' order.
    pub fn status_into(&self, out: &mut Vec<usize>) {
        out.clear();
        out.push(self.batch_size);
        out.push(self.tables.rows.as_ref().map_or(0, |r| r.rows));
        for t in &self.tables.list {
            t.status(&mut |_, v| out.push(v));
        }
        out.push(usize::from(self.saw_placeholders()));
        out.push(usize::from(self.any_active()));
    }

    /// The step's status as (name, value) pairs (tests, debugging).
    pub fn status(&self) -> Status {
        let mut values = Vec::new();
        self.status_into(&mut values);
        Status(self.status_names().into_iter().zip(values).collect())
    }
}

/// What a step left for the device side to read, by name (see [`Pipeline::status_names`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status(pub Vec<(String, usize)>);

impl Status {
    /// The value named `name` (0 when the pipeline has no such table).
    pub fn get(&self, name: &str) -> usize {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |&(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Move;
    use crate::fields::Value;
    use crate::history::SharedHistory;
    use crate::tables::logit_bias::LogitBiasTable;
    use crate::tables::thinking::ThinkingConfig;

    fn pipeline(stable: bool, token_feed_cap: usize) -> Pipeline<SharedHistory> {
        let mut cfg = PipelineConfig::new(4, 16)
            .with_cap("max_logit_bias_entries", 4)
            .with_cap("max_stop_token_ids", 4)
            .with_cap("max_bad_words", 4)
            .with_cap("max_bad_word_len", 4)
            .with_cap("max_allowed_token_ids", 8);
        for t in [
            "min_p",
            "logit_bias",
            "min_tokens",
            "penalties",
            "bad_words",
            "allowed",
            "thinking",
        ] {
            cfg = cfg.with(t);
        }
        cfg.thinking = Some(ThinkingConfig {
            start_ids: vec![1],
            end_ids: vec![2],
        });
        cfg.stable_slots = stable;
        cfg.max_rows = Some(token_feed_cap);
        Pipeline::new(cfg).unwrap()
    }

    fn req() -> RequestParams<SharedHistory> {
        let mut p = RequestParams::neutral(Output::fed(Vec::new()));
        p.set("min_p", Value::Float(0.5));
        p.set("logit_bias", Value::Bias(vec![(3, 1.0)]));
        p.set("min_tokens", Value::Int(5));
        p.set("stop_token_ids", Value::Ids(Some(vec![4])));
        p.set("repetition_penalty", Value::Float(1.5));
        p.set("bad_words", Value::IdLists(vec![vec![5, 6]]));
        p.set("allowed_token_ids", Value::Ids(Some(vec![3, 4, 6])));
        p.set("thinking_token_budget", Value::OptInt(Some(3)));
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
                0 => r.set("min_p", Value::Float(2.0)),
                1 => r.set("logit_bias", Value::Bias(vec![(16, 1.0)])),
                2 => r.set("stop_token_ids", Value::Ids(Some(vec![99]))),
                3 => r.set("repetition_penalty", Value::Float(f64::NAN)),
                4 => r.set("bad_words", Value::IdLists(vec![vec![]])),
                _ => r.set("thinking_token_budget", Value::OptInt(Some(-7))),
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
    fn a_feed_has_one_entry_per_row_of_the_last_step() {
        let mut p = Pipeline::new(PipelineConfig::new(4, 16).with("penalties")).unwrap();
        let mut u = BatchUpdate::new(2);
        u.added = vec![(0, req()), (1, req())];
        p.step(Some(u), None).unwrap();
        for (feed, pos) in [(&[3][..], 1), (&[3, 4, 5][..], 2), (&[][..], 0)] {
            let e = p.step(None, Some((feed, None))).unwrap_err();
            assert_eq!(
                (e.index(), e.field()),
                (Some(pos), Some("sampled_token_ids"))
            );
        }
        assert_eq!(p.history(0), Some(&[][..]));
        p.step(None, Some((&[3, -1], None))).unwrap();
        assert_eq!(p.history(0), Some(&[3][..]));
    }

    #[test]
    fn a_bad_token_feed_stops_the_update_too() {
        let mut p = Pipeline::new(PipelineConfig::new(4, 16).with("penalties")).unwrap();
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
            p.tables()
                .get::<crate::tables::penalties::PenaltiesState<HistoryId>>()
                .unwrap()
                .counted(0),
            Some(&[3][..])
        );
    }

    /// The registry's `history` (what Python is told) is the table's own word: a table reads
    /// histories exactly when it has the [`ReadsHistory`](crate::processor::ReadsHistory)
    /// capability, which is what the pipeline goes by.
    #[test]
    fn the_registry_says_which_tables_read_histories() {
        let mut cfg = PipelineConfig::new(4, 16);
        for b in BUILTINS {
            cfg = cfg.with(b.name);
        }
        cfg.thinking = Some(ThinkingConfig {
            start_ids: vec![1],
            end_ids: vec![2],
        });
        let p: Pipeline<SharedHistory> = Pipeline::new(cfg).unwrap();
        assert_eq!(p.tables().iter().count(), BUILTINS.len());
        for t in p.tables().iter() {
            let b = builtin(t.name()).unwrap();
            assert_eq!(b.history, t.history().is_some(), "{}", b.name);
        }
    }

    #[test]
    fn stable_slots_apply_changes_at_the_step_in_call_order() {
        let mut p = pipeline(true, 8);
        p.add_request(2, req()).unwrap();
        p.remove_request(2).unwrap();
        p.add_request(3, req()).unwrap();
        let mut bad = req();
        bad.set("min_p", Value::Float(-1.0));
        assert!(p.add_request(1, bad).is_err());
        assert_eq!(
            p.tables().get::<LogitBiasTable>().unwrap().state.active(),
            0
        );
        p.step_slots(&[3, 3, 0], None, None).unwrap();
        let bias = &p.tables().get::<LogitBiasTable>().unwrap().state;
        assert_eq!((bias.get(2), bias.get(3).is_some()), (None, true));
        let s = p.status();
        assert_eq!(s.get("rows"), 3);
        // Slot 3's bias lands on rows 0 and 1, none on row 2 (slot 0 is empty).
        let rs = p
            .tables()
            .get::<LogitBiasTable>()
            .unwrap()
            .row_copy()
            .unwrap();
        assert_eq!(rs.triples().triples(), vec![(0, 3, 1.0), (1, 3, 1.0)]);
        assert!(p.step_slots(&[9], None, None).is_err());
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

    #[test]
    fn draft_rows_see_their_drafts_and_the_committed_state_comes_back() {
        use crate::tables::bad_words::BadWordsTable;
        use crate::tables::min_tokens::MinTokensTable;
        let mut p = pipeline(true, 12); // 3 rows per slot: draft positions up to 2
        p.add_request(3, req()).unwrap();
        p.step_slots(&[3], None, None).unwrap();
        let triples = |p: &Pipeline<SharedHistory>| {
            let bad = p.tables().get::<BadWordsTable>().unwrap();
            let mt = p.tables().get::<MinTokensTable>().unwrap();
            let rows = |t: Option<&crate::row_space::RowCopy>| t.unwrap().triples().triples();
            (
                p.status(),
                bad.state.triples().triples(),
                mt.state.triples().triples(),
                rows(bad.row_copy()),
                rows(mt.row_copy()),
            )
        };
        let before = triples(&p);
        // Slot 3 owns rows 0..3 at positions 0, 1, 2 after the drafts 5, 6.
        let d = Drafts::from_runs(&[3, 3, 3], &[0, 1, 2], &[9, 5, 6]).unwrap();
        assert_eq!((d.slots.clone(), d.tokens.clone()), (vec![3], vec![5, 6]));
        p.map_rows(&[3, 3, 3], Some(d)).unwrap();
        // Bad words [5, 6]: only the row after the draft 5 bans 6.
        let bad = p
            .tables()
            .get::<BadWordsTable>()
            .unwrap()
            .row_copy()
            .unwrap();
        assert_eq!(bad.triples().triples(), vec![(1, 6, f32::NEG_INFINITY)]);
        // min_tokens 5: every row is below it (0, 1, 2 output tokens), stop id 4 masked.
        let mt = p
            .tables()
            .get::<MinTokensTable>()
            .unwrap()
            .row_copy()
            .unwrap();
        let rows: Vec<i32> = mt.triples().triples().iter().map(|t| t.0).collect();
        assert_eq!(rows, vec![0, 1, 2]);
        // Mapped again without drafts: the committed state, as before the replay.
        p.map_rows(&[3], None).unwrap();
        assert!(before == triples(&p), "the committed state changed");
    }

    #[test]
    fn draft_layouts_that_are_not_runs_are_refused() {
        for (map, pos) in [
            (&[3, 3][..], &[0, 2][..]), // a position skipped
            (&[3, 3], &[1, 0]),         // a run that does not start at 0
            (&[3, 2], &[0, 1]),         // a run crossing slots
            (&[3, 3], &[0, 0]),         // a slot's second run
        ] {
            assert!(
                Drafts::from_runs(map, pos, &[1, 1]).is_err(),
                "{map:?} {pos:?}"
            );
        }
        let mut p = pipeline(true, 8);
        p.add_request(3, req()).unwrap();
        p.step_slots(&[3], None, None).unwrap();
        let bad = Drafts::from_runs(&[3, 3], &[0, 1], &[1, 16]).unwrap(); // 16: past the vocab
        assert!(p.map_rows(&[3, 3], Some(bad)).is_err());
        let deep = Drafts::new(vec![0, 1, 2, 3], &[(3, &[1, 1, 1][..])]); // beyond max_rows / 4
        assert!(p.map_rows(&[3, 3, 3, 3], Some(deep)).is_err());
    }

    #[test]
    fn a_refused_sync_keeps_what_it_found_replaced() {
        // Request 0 thinks (start 1, end 2); its list is truncated and regrown with the end
        // token (thinking ended) in the same step as a token after a placeholder is refused, in
        // request 1's list or its own. Once that is repaired, every table holds what a twin
        // that never saw the refusal holds (the thinking table sees the rewrite only through
        // the sync's mark). At a step, and at the re-read of placeholders before apply.
        use std::sync::{Arc, RwLock};
        for restep in [false, true] {
            for own in [false, true] {
                let tail: &[i64] = if restep { &[-1] } else { &[] };
                let list = |tokens: &[i64]| -> SharedHistory {
                    Arc::new(RwLock::new([tokens, tail].concat()))
                };
                // Past the budget: forced to end, unless the end token is seen.
                let regrown = [&[1, 2, 6][..], &[3; 10]].concat();
                let world = || {
                    let srcs = [list(&[1, 3, 4]), list(&[5])];
                    let mut p = pipeline(false, 4);
                    let mut u = BatchUpdate::new(2);
                    for (slot, src) in srcs.iter().enumerate() {
                        let output = Output {
                            tokens: src.read().unwrap().clone(),
                            source: Some(src.clone()),
                        };
                        let mut r = RequestParams::neutral(output);
                        r.set("thinking_token_budget", Value::OptInt(Some(8)));
                        u.added.push((slot, r));
                    }
                    p.update(u).unwrap();
                    *srcs[0].write().unwrap() = regrown.clone();
                    (p, srcs)
                };
                let again = |p: &mut Pipeline<SharedHistory>| {
                    if restep {
                        p.restep()
                    } else {
                        p.update_none()
                    }
                };
                let (mut ours, srcs) = world();
                let (mut twin, twin_srcs) = world();
                let before = snapshot(&ours);
                let bad = usize::from(!own);
                srcs[bad].write().unwrap().extend([-1, 9]); // a token after a placeholder
                for _ in 0..2 {
                    let e = again(&mut ours).unwrap_err();
                    assert_eq!((e.index(), e.field()), (Some(bad), Some("output_tok_ids")));
                    assert_eq!(snapshot(&ours), before, "restep {restep}, own {own}");
                }
                for s in [&srcs, &twin_srcs] {
                    let mut v = s[bad].write().unwrap();
                    *v = if own { regrown.clone() } else { vec![5] };
                    v.push(9);
                }
                again(&mut ours).unwrap();
                again(&mut twin).unwrap();
                assert_eq!(
                    snapshot(&ours),
                    snapshot(&twin),
                    "restep {restep}, own {own}"
                );
            }
        }
    }
}
