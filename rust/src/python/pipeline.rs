//! Binding for [`crate::pipeline::Pipeline`]: one object per processor set, one call per step.
//!
//! Wiring only: the update's shape and each added request's parameters are read here (once),
//! everything else is the core's. Host buffers are exported as `HostBufferView`s (DLPack).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::Error;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyFrozenSet, PyList, PySet, PyString};

use super::buffer::{logits_rows, HostBufferView};
use super::errors::is_interrupt;
use super::history::{describe, int_item, NotInt, PyListSource};
use super::params::{column_kind, ColumnDecl, Reader};
use super::update::{parse_update, AddedEntry};
use crate::arena::Upload;
use crate::batch::BatchUpdate;
use crate::pipeline::{self, Drafts, PipelineConfig, RequestParams, ThinkingConfig};
use crate::processor::{HostData, HostLogits};
use crate::tables::columns::ColumnSpec;

#[pyclass(module = "logitsproc_rs._core")]
pub struct Pipeline {
    inner: pipeline::Pipeline<PyListSource>,
    reader: Reader,
    /// The list `step` last wrote the status into, and what it wrote: the next step writes
    /// only the entries that changed (a Python int per entry is most of the cost).
    status_list: Option<Py<PyList>>,
    status_written: Vec<usize>,
    status_scratch: Vec<usize>,
}

/// Ints from the host, one per position (a token feed, its slots, a row map): `bytes` of
/// native int64 (what the Python side makes of a tensor or an array, one copy), or an ordered
/// iterable of ints (Python ints or numpy integer scalars; see [`int_item`]); at most `max`
/// of them. Read element by element, bounded, trusting no `__len__`. A bad item is named by
/// its position (`index`); `KeyboardInterrupt` and `SystemExit` raised by the caller's
/// iterator go through untouched, any other error of theirs becomes a `ValueError`.
fn host_ints(obj: &Bound<'_, PyAny>, field: &'static str, max: usize) -> PyResult<Vec<i64>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        let raw = b.as_bytes();
        if raw.len() % 8 != 0 {
            return Err(PyErr::from(Error::invalid_input(
                field,
                "int64 bytes: a length not a multiple of 8",
            )));
        }
        if raw.len() / 8 > max {
            return Err(crate::error::Error::TooLarge {
                field,
                value: raw.len() / 8,
                max,
            }
            .into());
        }
        return Ok(raw
            .chunks_exact(8)
            .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
            .collect());
    }
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyDict>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>()
    {
        return Err(PyErr::from(Error::invalid_input(
            field,
            format!("expected a sequence of ints, got {}", describe(obj)),
        )));
    }
    let raised = |what: &str, e: PyErr| {
        if is_interrupt(&e) {
            e
        } else {
            PyErr::from(Error::invalid_input(field, format!("{what} raised {e}")))
        }
    };
    let iter = obj.try_iter().map_err(|e| {
        if is_interrupt(&e) {
            e
        } else {
            PyErr::from(Error::invalid_input(
                field,
                format!("expected a sequence of ints, got {} ({e})", describe(obj)),
            ))
        }
    })?;
    let mut out: Vec<i64> = Vec::new();
    for (pos, item) in iter.enumerate() {
        if pos == max {
            return Err(PyErr::from(Error::invalid(
                pos,
                field,
                format!("position {pos}: more than the {max} rows one step may have"),
            )));
        }
        let item = item.map_err(|e| raised("iterating it", e))?;
        let v = int_item(&item).map_err(|why| {
            PyErr::from(Error::invalid(pos, field, format!("position {pos}: {why}")))
        })?;
        out.try_reserve(1)
            .map_err(|_| PyErr::from(Error::RequestOutOfMemory { index: pos, field }))?;
        out.push(v);
    }
    Ok(out)
}

/// [`host_ints`] as slots (non-negative; the core checks them against the capacity).
fn host_slots(obj: &Bound<'_, PyAny>, field: &'static str, max: usize) -> PyResult<Vec<usize>> {
    let v = host_ints(obj, field, max)?;
    v.into_iter()
        .enumerate()
        .map(|(r, s)| {
            usize::try_from(s).map_err(|_| {
                PyErr::from(Error::invalid(
                    r,
                    field,
                    format!("position {r}: {s} is negative"),
                ))
            })
        })
        .collect()
}

/// A slot argument (`add_request` / `remove_request`): a Python int or a numpy integer;
/// anything else (a bool, a float, a str, None, an object with `__index__`, whose code never
/// runs) and a negative one is a `RequestError` naming the field `slot` and the slot, and
/// one past the capacity the core's `BatchUpdateError` naming it (`index`).
fn slot_arg(obj: &Bound<'_, PyAny>, capacity: usize) -> PyResult<usize> {
    let what = match int_item(obj) {
        Ok(v) => match usize::try_from(v) {
            Ok(s) if s < capacity => return Ok(s),
            Ok(s) => {
                return Err(crate::error::Error::IndexOutOfRange {
                    index: s,
                    field: "slot",
                    capacity,
                }
                .into())
            }
            Err(_) => v.to_string(),
        },
        Err(NotInt::Range(v)) => v,
        Err(NotInt::Kind(d)) => d,
    };
    Err(PyErr::from(Error::invalid_input(
        "slot",
        format!("slot {what} is not an int in [0, {capacity}) (max_num_seqs)"),
    )))
}

impl Pipeline {
    /// Most rows a feed or a row map may have.
    fn max_rows(&self) -> usize {
        self.inner.max_rows()
    }

    /// MRV2's draft layout (`local_pos` and `input_ids`, both or neither) of a row map.
    fn draft_runs(
        &self,
        map: &[usize],
        local_pos: Option<&Bound<'_, PyAny>>,
        input_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Drafts>> {
        match (local_pos, input_ids) {
            (None, None) => Ok(None),
            (Some(p), Some(t)) => Ok(Some(Drafts::from_runs(
                map,
                &host_slots(p, "local_pos", self.max_rows())?,
                &host_ints(t, "input_ids", self.max_rows())?,
            )?)),
            _ => Err(PyErr::from(Error::invalid_input(
                "input_ids",
                "local_pos and input_ids go together (a draft layout has both)",
            ))),
        }
    }

    fn status_vec(&self) -> Vec<usize> {
        let mut out = Vec::new();
        self.inner.status_into(&mut out);
        out
    }

    fn read_update(
        &self,
        bu: &Bound<'_, PyAny>,
    ) -> PyResult<BatchUpdate<RequestParams<PyListSource>>> {
        // Valid updates hold at most `capacity` adds, removals and moves; allow slack.
        let max = self.inner.capacity().saturating_mul(4).saturating_add(16);
        parse_update(bu, max, |e| self.reader.read(&self.inner, e))
    }

    /// The status into `out`, writing only what changed since the last write into the same
    /// list (held, so it cannot be another list at the same address).
    fn write_status(&mut self, out: &Bound<'_, PyList>) -> PyResult<()> {
        self.inner.status_into(&mut self.status_scratch);
        let same = self.status_list.as_ref().is_some_and(|l| l.is(out))
            && out.len() == self.status_written.len();
        for (i, &v) in self.status_scratch.iter().enumerate() {
            if same && self.status_written[i] == v {
                continue;
            }
            if i < out.len() {
                out.set_item(i, v)?;
            } else {
                out.append(v)?;
            }
        }
        std::mem::swap(&mut self.status_written, &mut self.status_scratch);
        if !same {
            self.status_list = Some(out.clone().unbind());
        }
        Ok(())
    }

    fn check_rows(&self, rows: usize, mapped: bool) -> PyResult<Option<&[usize]>> {
        if mapped {
            let map = self.inner.row_map().unwrap_or(&[]);
            if rows > map.len() {
                return Err(PyValueError::new_err(
                    "logits have more rows than the row map",
                ));
            }
            Ok(Some(map))
        } else {
            if rows > self.inner.batch_size() {
                return Err(PyValueError::new_err(
                    "logits have more rows than the batch",
                ));
            }
            Ok(None)
        }
    }
}

/// Work on this many logits (or entries) or more runs with the GIL released. Below it the
/// kernel takes microseconds, while giving the GIL back and taking it again costs a handoff
/// whenever other threads wait for it (an in-process vLLM engine has several): measured in
/// such an engine, 16 x 512 logits took about 200 µs detached and a few µs attached.
const DETACH_MIN_ELEMENTS: usize = 1 << 18;

fn detach_if_large<T: Send>(py: Python<'_>, elements: usize, f: impl FnOnce() -> T + Send) -> T {
    if elements >= DETACH_MIN_ELEMENTS {
        py.detach(f)
    } else {
        f()
    }
}

#[pymethods]
impl Pipeline {
    /// Builds the built-in tables named in `tables` (see `registry()`), sized by the
    /// per-request `caps` (engine-config names; a cap not given takes its default), and the
    /// declared `columns`; `thinking` is `(start_ids, end_ids)`, needed by the "thinking"
    /// table. `refuse`: `(table, hint)` for tables it does not build whose processor a request
    /// must not ask for: a request setting one of their switching fields is refused, naming
    /// the field, with `hint` (how to get the processor).
    #[new]
    #[pyo3(signature = (capacity, vocab_size, *, tables=Vec::new(), caps=Vec::new(),
                        thinking=None, spec_tokens=0, columns=Vec::new(), stable_slots=false,
                        token_feed=false, max_rows=None, host_kernels=false, refuse=Vec::new()))]
    fn new(
        py: Python<'_>,
        capacity: usize,
        vocab_size: usize,
        tables: Vec<String>,
        caps: Vec<(String, usize)>,
        thinking: Option<(Vec<i64>, Vec<i64>)>,
        spec_tokens: usize,
        columns: Vec<ColumnDecl>,
        stable_slots: bool,
        token_feed: bool,
        max_rows: Option<usize>,
        host_kernels: bool,
        refuse: Vec<(String, String)>,
    ) -> PyResult<Self> {
        let mut refused = Vec::with_capacity(refuse.len());
        for (name, hint) in refuse {
            let table = crate::tables::builtin(&name).filter(|_| !tables.contains(&name));
            let Some(table) = table else {
                return Err(crate::error::Error::Config {
                    field: "refuse",
                    message: format!("'{name}' is no built-in table this pipeline lacks"),
                }
                .into());
            };
            refused.push((table, hint));
        }
        let mut specs = Vec::with_capacity(columns.len());
        let mut readers = Vec::with_capacity(columns.len());
        for (name, kind, width, default, reader) in columns {
            let kind = column_kind(&name, &kind, width, default)?;
            specs.push(ColumnSpec {
                name: name.clone(),
                kind: kind.clone(),
            });
            readers.push((name, kind, reader));
        }
        let cfg = PipelineConfig {
            capacity,
            vocab_size,
            tables,
            caps,
            thinking: thinking.map(|(start_ids, end_ids)| ThinkingConfig { start_ids, end_ids }),
            spec_tokens,
            columns: specs,
            stable_slots,
            max_rows,
            host_kernels,
        };
        let inner = pipeline::Pipeline::new(cfg.clone())?;
        let reader = Reader::new(py, inner.fields(), &cfg, token_feed, readers, &refused);
        Ok(Pipeline {
            inner,
            reader,
            status_list: None,
            status_written: Vec::new(),
            status_scratch: Vec::new(),
        })
    }

    /// One step: the token feed (if given), then the batch update (or, with None, only the
    /// per-step work), all checked before anything changes. `sampled_token_ids[r]` is the
    /// token sampled last step for row `r` (or for slot `slots[r]`), −1 for none.
    ///
    /// `status`: a list to write the step's status into (as `status_into`); `discard`: forget
    /// what changed afterwards (the CPU path, as `discard`). Both save a call per step.
    #[pyo3(signature = (batch_update=None, sampled_token_ids=None, slots=None, status=None,
                        discard=false))]
    fn step(
        &mut self,
        batch_update: Option<&Bound<'_, PyAny>>,
        sampled_token_ids: Option<&Bound<'_, PyAny>>,
        slots: Option<&Bound<'_, PyAny>>,
        status: Option<&Bound<'_, PyList>>,
        discard: bool,
    ) -> PyResult<()> {
        let update = batch_update.map(|bu| self.read_update(bu)).transpose()?;
        let tokens = sampled_token_ids
            .map(|t| host_ints(t, "sampled_token_ids", self.max_rows()))
            .transpose()?;
        let slots = slots
            .map(|s| host_slots(s, "slots", self.max_rows()))
            .transpose()?;
        let feed = tokens.as_deref().map(|t| (t, slots.as_deref()));
        self.inner.step(update, feed)?;
        if discard {
            self.inner.discard();
        }
        if let Some(out) = status {
            self.write_status(out)?;
        }
        Ok(())
    }

    /// The first half of `step` (same arguments), for a step over several pipelines that
    /// must all accept it first (`LogitsProcessors.update_state`): reads and checks
    /// everything, changes nothing a table holds; then `commit` or `abort`.
    #[pyo3(signature = (batch_update=None, sampled_token_ids=None, slots=None))]
    fn prepare(
        &mut self,
        batch_update: Option<&Bound<'_, PyAny>>,
        sampled_token_ids: Option<&Bound<'_, PyAny>>,
        slots: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if self.inner.has_prepared() {
            return Err(crate::error::Error::Protocol(
                "a prepared step is pending: commit or abort it first".into(),
            )
            .into());
        }
        let update = batch_update.map(|bu| self.read_update(bu)).transpose()?;
        let tokens = sampled_token_ids
            .map(|t| host_ints(t, "sampled_token_ids", self.max_rows()))
            .transpose()?;
        let slots = slots
            .map(|s| host_slots(s, "slots", self.max_rows()))
            .transpose()?;
        Ok(self.inner.prepare(update, tokens.map(|t| (t, slots)))?)
    }

    /// Applies the step `prepare` checked; `status` and `discard` as in `step`.
    #[pyo3(signature = (status=None, discard=false))]
    fn commit(&mut self, status: Option<&Bound<'_, PyList>>, discard: bool) -> PyResult<()> {
        self.inner.commit_prepared()?;
        if discard {
            self.inner.discard();
        }
        if let Some(out) = status {
            self.write_status(out)?;
        }
        Ok(())
    }

    /// Drops the step `prepare` checked: every table as before it.
    fn abort(&mut self) {
        self.inner.abort_prepared();
    }

    /// Stable slots: the request now in `slot` (overwrites what it held).
    #[pyo3(signature = (slot, params, prompt_tok_ids=None, output_tok_ids=None))]
    fn add_request(
        &mut self,
        py: Python<'_>,
        slot: &Bound<'_, PyAny>,
        params: Bound<'_, PyAny>,
        prompt_tok_ids: Option<Bound<'_, PyAny>>,
        output_tok_ids: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let slot = slot_arg(slot, self.inner.capacity())?;
        let entry = AddedEntry {
            index: slot,
            params,
            prompt_tok_ids: prompt_tok_ids.unwrap_or_else(|| py.None().into_bound(py)),
            output_tok_ids: output_tok_ids
                .unwrap_or_else(|| pyo3::types::PyList::empty(py).into_any()),
        };
        let p = self.reader.read(&self.inner, &entry)?;
        Ok(self.inner.add_request(slot, p)?)
    }

    /// Stable slots: committed tokens by slot, appended without a step (read by the next).
    fn feed_slots(
        &mut self,
        sampled_token_ids: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let tokens = host_ints(sampled_token_ids, "sampled_token_ids", self.max_rows())?;
        let slots = host_slots(slots, "slots", self.max_rows())?;
        Ok(self.inner.feed_slots(&tokens, &slots)?)
    }

    /// Stable slots: `slot` is free.
    fn remove_request(&mut self, slot: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self
            .inner
            .remove_request(slot_arg(slot, self.inner.capacity())?)?)
    }

    /// Stable slots, one step: the token feed (`sampled_token_ids[k]` for slot `slots[k]`),
    /// the slot changes since the last step, the per-step work, and the row map of this step
    /// (logits row `r` belongs to slot `row_to_slot[r]`) with its draft layout (`local_pos`
    /// and `input_ids`, both or neither), all checked first.
    #[pyo3(signature = (row_to_slot, sampled_token_ids=None, slots=None, local_pos=None, input_ids=None))]
    fn step_slots(
        &mut self,
        row_to_slot: &Bound<'_, PyAny>,
        sampled_token_ids: Option<&Bound<'_, PyAny>>,
        slots: Option<&Bound<'_, PyAny>>,
        local_pos: Option<&Bound<'_, PyAny>>,
        input_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let map = host_slots(row_to_slot, "row_to_slot", self.max_rows())?;
        let tokens = sampled_token_ids
            .map(|t| host_ints(t, "sampled_token_ids", self.max_rows()))
            .transpose()?;
        let slots = slots
            .map(|s| host_slots(s, "slots", self.max_rows()))
            .transpose()?;
        let feed = match (&tokens, &slots) {
            (Some(t), Some(s)) => Some((t.as_slice(), s.as_slice())),
            (None, None) => None,
            _ => {
                return Err(PyErr::from(Error::invalid_input(
                    "slots",
                    "sampled_token_ids and slots go together (the slot each token is for)",
                )))
            }
        };
        let drafts = self.draft_runs(&map, local_pos, input_ids)?;
        Ok(self.inner.step_slots(&map, feed, drafts)?)
    }

    /// Stable slots: rebuild the row-space copies for `row_to_slot` (and its draft layout)
    /// without a step.
    #[pyo3(signature = (row_to_slot, local_pos=None, input_ids=None))]
    fn map_rows(
        &mut self,
        row_to_slot: &Bound<'_, PyAny>,
        local_pos: Option<&Bound<'_, PyAny>>,
        input_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let map = host_slots(row_to_slot, "row_to_slot", self.max_rows())?;
        let drafts = self.draft_runs(&map, local_pos, input_ids)?;
        Ok(self.inner.map_rows(&map, drafts)?)
    }

    /// The row map with drafts given per slot (the V1 layout): row `r` at draft position
    /// `positions[r]` of its slot; slot `draft_slots[k]`'s drafts are
    /// `draft_tokens[draft_offsets[k]..draft_offsets[k + 1]]`.
    fn map_draft_rows(
        &mut self,
        row_to_slot: &Bound<'_, PyAny>,
        positions: &Bound<'_, PyAny>,
        draft_slots: &Bound<'_, PyAny>,
        draft_offsets: &Bound<'_, PyAny>,
        draft_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let rows = self.max_rows();
        let map = host_slots(row_to_slot, "row_to_slot", rows)?;
        let most_tokens = rows.saturating_mul(self.inner.capacity().max(1));
        let drafts = Drafts {
            pos: host_slots(positions, "positions", rows)?,
            slots: host_slots(draft_slots, "draft_slots", self.inner.capacity())?,
            offsets: host_slots(draft_offsets, "draft_offsets", self.inner.capacity() + 1)?,
            tokens: host_ints(draft_tokens, "draft_tokens", most_tokens)?,
        };
        Ok(self.inner.map_rows(&map, Some(drafts))?)
    }

    /// Stable slots: map the last row map again, with its draft layout (after a re-step).
    fn remap_rows(&mut self) -> PyResult<()> {
        Ok(self.inner.remap_rows()?)
    }

    /// Looks again at the outputs that ended in an async placeholder at the last step.
    fn restep(&mut self) -> PyResult<()> {
        Ok(self.inner.restep()?)
    }

    /// Copies what changed into staging copy `k`; returns the upload to make, or None:
    /// `("span", lo, hi)` (copy staging bytes `[lo, hi)` to the same arena bytes) or
    /// `("packed", words, index_offset)` (copy `index_offset + 8 * words` bytes to a scratch
    /// area, then scatter the int32 words to their int64 word indices). `all=True` stages
    /// everything as one span (the first upload).
    #[pyo3(signature = (k, all=false))]
    fn stage(&mut self, k: usize, all: bool) -> PyResult<Option<(&'static str, usize, usize)>> {
        Ok(self.inner.stage(k, all)?.map(|u| match u {
            Upload::Span { lo, hi } => ("span", lo, hi),
            Upload::Packed {
                words,
                index_offset,
            } => ("packed", words, index_offset),
        }))
    }

    /// The CPU path (torch reads the buffers themselves): forget what changed, counting it.
    fn discard(&mut self) {
        self.inner.discard();
    }

    /// Staging copy `k` of the arena, as uint8 (to pin and to copy from).
    fn staging(&mut self, k: usize) -> PyResult<HostBufferView> {
        Ok(HostBufferView::new(self.inner.arena_mut().staging(k)?))
    }

    /// `(name, byte offset, bytes, dtype, elements)` of every arena section, in order.
    fn sections(&self) -> Vec<(String, usize, usize, &'static str, usize)> {
        self.inner
            .arena()
            .sections()
            .iter()
            .map(|s| {
                let dtype = match s.dtype {
                    (2, 32) => "float32",
                    (0, 32) => "int32",
                    (0, 64) => "int64",
                    _ => "uint8",
                };
                (s.name.clone(), s.offset, s.bytes, dtype, s.len)
            })
            .collect()
    }

    /// The table's own host buffer behind section `i` (what torch reads on the CPU).
    fn buffer(&self, i: usize) -> PyResult<HostBufferView> {
        self.inner
            .arena()
            .source(i)
            .map(HostBufferView::new)
            .ok_or_else(|| PyValueError::new_err(format!("no arena section {i}")))
    }

    /// Most logits rows one step may have (entries of a feed or a row map).
    #[getter(max_rows)]
    fn max_rows_py(&self) -> usize {
        self.inner.max_rows()
    }

    #[getter]
    fn arena_bytes(&self) -> usize {
        self.inner.arena().total_bytes()
    }

    /// Bytes the last stage (or discard) carried: zero on a step that changed nothing.
    #[getter]
    fn last_upload_bytes(&self) -> usize {
        self.inner.arena().last_upload_bytes()
    }

    #[getter]
    fn uploaded_total(&self) -> u64 {
        self.inner.arena().uploaded_total()
    }

    #[getter]
    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// The names of `status`'s values, in order (fixed for the pipeline's life).
    fn status_names(&self) -> Vec<String> {
        self.inner.status_names()
    }

    /// The numbers the processors' applies read, as a list in `status_names`' order:
    /// `batch_size`, each table's counts (`min_p`, `logit_bias`, `rows.logit_bias`, ...,
    /// `column.<k>`), then `placeholders`, `rows`, `stepping`.
    fn status(&self) -> Vec<usize> {
        self.status_vec()
    }

    /// As `status`, written into an existing list (no new container per step).
    fn status_into(&mut self, out: &Bound<'_, PyList>) -> PyResult<()> {
        self.write_status(out)
    }

    /// Whether table `table`'s triples add to the logits (`true`) or put their values
    /// (`false`); `None` for a table without triples (or not in the pipeline). The views
    /// apply them so, from the table's own word.
    fn triples_add(&self, table: &str) -> Option<bool> {
        let (_, adds) = self.inner.tables().named(table)?.host()?.triples()?;
        Some(adds)
    }

    /// Table `table` applied by Rust on CPU logits, in place, from its own state (the CPU
    /// path). The caller passes `tensor.data_ptr()` after checking the dtype (float32, or
    /// float64 with `float64`), device CPU, unit column stride and shape; `mapped` lines rows
    /// up through the last row map (stable slots). A table with no host form for these
    /// logits is a `ValueError` saying why.
    #[pyo3(signature = (table, ptr, rows, vocab, row_stride, mapped=false, float64=false))]
    fn unsafe_apply_cpu(
        &self,
        py: Python<'_>,
        table: &str,
        ptr: usize,
        rows: usize,
        vocab: usize,
        row_stride: usize,
        mapped: bool,
        float64: bool,
    ) -> PyResult<()> {
        let map = self.check_rows(rows, mapped)?;
        let Some(t) = self.inner.tables().named(table) else {
            return Err(PyValueError::new_err(format!(
                "this pipeline has no {table} table"
            )));
        };
        if vocab > self.inner.vocab_size() {
            return Err(PyValueError::new_err(
                "logits are wider than the vocabulary",
            ));
        }
        // Sparse work is the triples, dense work the logits (see DETACH_MIN_ELEMENTS).
        let work = t
            .host()
            .and_then(|h| h.triples())
            .filter(|_| map.is_none())
            .map_or(rows * vocab, |(s, _)| s.len());
        let data = if float64 {
            // SAFETY: the Python caller checked the tensor (see the docstring).
            HostData::F64(unsafe { logits_rows::<f64>(ptr, rows, vocab, row_stride)? })
        } else {
            // SAFETY: as above.
            HostData::F32(unsafe { logits_rows::<f32>(ptr, rows, vocab, row_stride)? })
        };
        let mut logits = HostLogits {
            data,
            rows,
            vocab,
            row_stride,
            row_to_slot: map,
        };
        detach_if_large(py, work, || t.apply_host(&mut logits))
            .map_err(|why| PyValueError::new_err(format!("{table} {why}")))
    }

    /// Draft-row masks of MinTokens; returns (layout rows, padded triples).
    fn spec_min_tokens(&mut self, num_draft_tokens: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
        let n = host_slots(num_draft_tokens, "num_draft_tokens", self.inner.capacity())?;
        Ok(self.inner.spec_min_tokens(&n)?)
    }

    /// Draft-row bans of bad words; returns (layout rows, padded triples).
    fn spec_bad_words(
        &mut self,
        num_draft_tokens: &Bound<'_, PyAny>,
        spec_token_ids: Vec<Vec<i64>>,
    ) -> PyResult<(usize, usize)> {
        let n = host_slots(num_draft_tokens, "num_draft_tokens", self.inner.capacity())?;
        Ok(self.inner.spec_bad_words(&n, &spec_token_ids)?)
    }

    // --- penalties' device matrix (GPU path) ---

    /// Row copies pending for the device count matrix (prefix of copy_dst / copy_src), handed
    /// out once: a second call returns 0 until the next update.
    fn take_penalty_copies(&mut self) -> usize {
        self.inner.take_penalty_copies()
    }

    /// Moves the next chunk of (row, token, delta) count additions into the ops buffers;
    /// returns its padded length (0 when none are left).
    fn next_penalty_chunk(&mut self) -> usize {
        self.inner.next_penalty_chunk()
    }

    #[getter]
    fn prompt_flag(&self) -> i32 {
        pipeline::PROMPT_FLAG
    }

    // --- inspection (tests, debugging) ---

    /// The stored float32 min_p of a slot (None outside the table).
    fn min_p(&self, index: i64) -> Option<f32> {
        let i = usize::try_from(index).ok()?;
        self.inner.min_p(i)
    }

    /// Requests each table tracks, as (table name, count) pairs.
    fn active(&self) -> Vec<(String, usize)> {
        self.inner
            .tables()
            .iter()
            .filter_map(|t| t.active().map(|n| (t.name().to_string(), n)))
            .collect()
    }

    /// Output tokens the penalties counted for a slot (None if untracked).
    fn penalties_counted(&self, index: usize) -> Option<Vec<i32>> {
        self.inner.penalties_counted(index).map(<[i32]>::to_vec)
    }

    /// The (row, token) pairs the thinking budget forces this step.
    fn thinking_forced(&self) -> Vec<(usize, i64)> {
        self.inner.thinking_forced().to_vec()
    }
}
