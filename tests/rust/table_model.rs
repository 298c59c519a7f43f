//! Model-based (state-machine) property tests for the per-slot state tables.
//!
//! Two step generators drive the same harness:
//! * `engine_*`: an engine loop that mirrors vLLM 0.25.1's `InputBatch` (semantics note §9.2-9.3):
//!   requests finish (`removed_append`), new ones take the lowest freed slot or the end of the
//!   batch (`pop_removed`), `condense` moves UNIDIRECTIONAL from the tail into the holes (popping
//!   them from `removed`), the reorder step SWAPs, and `get_and_reset(num_reqs)` hands out the
//!   update (`None` when nothing changed). Output lists grow by one token per live request and
//!   step. Besides the models, the tables are checked against the engine's own slot assignment.
//! * `arbitrary_*`: any valid update (random added/removed/moved, SWAPs with empty sides, UNI
//!   onto occupied destinations, duplicate removals, batch-size-only changes), `None`
//!   steps, and invalid updates (index >= capacity, duplicate add, batch_size > capacity, bad
//!   min_p / bias / min_tokens / token ids) that must return `Err` and change no observable.
//!
//! The models follow vLLM literally: `process_dict_updates` (§3.0) over a `Vec<Option<T>>` for
//! `SlotTable`, `LogitBiasState` and `MinTokensState`, and MinP's own `update_state` (§3.1).

use std::sync::{Arc, RwLock};

use logitsproc_rs::batch::{BatchUpdate, BatchUpdateBuilder, Move, MoveDirectionality};
use logitsproc_rs::fields::Value;
use logitsproc_rs::history::{SharedHistory, TokenHistory};
use logitsproc_rs::pipeline::{Output, Pipeline, PipelineConfig, RequestParams};
use logitsproc_rs::sparse::SparseRows;
use logitsproc_rs::table::SlotTable;
use logitsproc_rs::tables::logit_bias::{LogitBiasState, LogitBiasTable};
use logitsproc_rs::tables::min_p::MinPState;
use logitsproc_rs::tables::min_tokens::{MinTokensParams, MinTokensState, MinTokensTable};
use logitsproc_rs::Error;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;

const VOCAB: usize = 40;
const MAX_BIAS: usize = 4;
const MAX_STOP: usize = 3;

/// `cases` is the CI run. `LOGITSPROC_FUZZ_CASES=N` raises every property of this file to at
/// least `N` cases, for a long fuzz run:
/// `LOGITSPROC_FUZZ_CASES=200000 cargo test --release --test table_model`.
fn config(cases: u32) -> Config {
    let fuzz = std::env::var("LOGITSPROC_FUZZ_CASES").ok().map(|v| {
        v.trim()
            .parse::<u32>()
            .unwrap_or_else(|_| panic!("LOGITSPROC_FUZZ_CASES must be a case count, got {v:?}"))
    });
    Config {
        cases: fuzz.map_or(cases, |n| n.max(cases)),
        // Failing inputs are printed (shrunk), not persisted to a proptest-regressions/ file.
        failure_persistence: None,
        ..Config::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// A request's parameters as generated (shrinkable); `out_len` is its output length at the add.
#[derive(Clone, Debug)]
struct ReqSpec {
    tag: Option<u32>,
    min_p: f64,
    bias: Vec<(i64, f64)>,
    min_tokens: i64,
    stop: Vec<i64>,
    out_len: usize,
}

/// A live request: parameters plus its output list, shared with the tables that hold it.
#[derive(Clone, Debug)]
struct Req {
    tag: Option<u32>,
    min_p: f64,
    bias: Vec<(i64, f64)>,
    min_tokens: i64,
    stop: Vec<i64>,
    output: SharedHistory,
}

impl Req {
    fn new(spec: &ReqSpec) -> Self {
        // logit_bias is a dict in vLLM: token ids are unique (keep the first position).
        let mut bias: Vec<(i64, f64)> = Vec::new();
        for &(t, b) in &spec.bias {
            if !bias.iter().any(|&(u, _)| u == t) {
                bias.push((t, b));
            }
        }
        Req {
            tag: spec.tag,
            min_p: spec.min_p,
            bias,
            min_tokens: spec.min_tokens,
            stop: spec.stop.clone(),
            output: Arc::new(RwLock::new(vec![7; spec.out_len])),
        }
    }

    fn plain() -> Self {
        Req::new(&ReqSpec {
            tag: None,
            min_p: 0.0,
            bias: vec![],
            min_tokens: 0,
            stop: vec![],
            out_len: 0,
        })
    }

    fn push_token(&self) {
        self.output.write().unwrap().push(3);
    }
}

fn req_spec() -> impl Strategy<Value = ReqSpec> {
    (
        prop::option::weighted(0.7, 0u32..1000),
        prop_oneof![
            6 => Just(0.0),
            1 => Just(-0.0),
            2 => Just(0.05),
            2 => Just(0.1),
            1 => Just(0.5),
            1 => Just(1.0),
            1 => Just(1e-46), // underflows to 0.0 as f32: no min_p
            1 => Just(1e-40), // f32 subnormal: a real (tiny) min_p
        ],
        prop_oneof![
            2 => Just(Vec::new()),
            3 => vec((0..VOCAB as i64, -100.0f64..100.0), 1..=MAX_BIAS),
        ],
        prop_oneof![2 => Just(0i64), 3 => 1i64..6],
        vec(0..VOCAB as i64, 0..=MAX_STOP),
        0usize..6,
    )
        .prop_map(|(tag, min_p, bias, min_tokens, stop, out_len)| ReqSpec {
            tag,
            min_p,
            bias,
            min_tokens,
            stop,
            out_len,
        })
}

/// One table's view of an update: same indices, each added request mapped to its payload.
fn project<B>(u: &BatchUpdate<Req>, f: impl Fn(&Req) -> B) -> BatchUpdate<B> {
    BatchUpdate {
        batch_size: u.batch_size,
        removed: u.removed.clone(),
        added: u.added.iter().map(|(i, r)| (*i, f(r))).collect(),
        moved: u.moved.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Model-side validation (written independently of the crate's)
// ---------------------------------------------------------------------------------------------

fn structurally_ok(u: &BatchUpdate<Req>, cap: usize) -> bool {
    let added_ok = u
        .added
        .iter()
        .enumerate()
        .all(|(k, (i, _))| *i < cap && u.added[..k].iter().all(|(j, _)| j != i));
    u.batch_size <= cap
        && u.removed.iter().all(|&i| i < cap)
        && added_ok
        && u.moved
            .iter()
            .all(|m| m.from < cap && m.to < cap && m.from != m.to)
}

fn min_p_ok(r: &Req) -> bool {
    (0.0..=1.0).contains(&r.min_p)
}

fn bias_ok(r: &Req) -> bool {
    r.bias.len() <= MAX_BIAS
        && r.bias
            .iter()
            .all(|&(t, b)| (0..VOCAB as i64).contains(&t) && (b as f32).is_finite())
}

fn min_tokens_ok(r: &Req) -> bool {
    r.min_tokens >= 0
        && r.stop.len() <= MAX_STOP
        && r.stop.iter().all(|t| (0..VOCAB as i64).contains(t))
}

// ---------------------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------------------

/// vLLM 0.25.1 `process_dict_updates`, literally, over a `Vec<Option<T>>` (a dict keyed by slot).
/// Returns vLLM's `updated` flag, and the same flag ignoring self-moves (`from == to`): vLLM pops
/// and re-inserts the state there and reports `updated`, although nothing changed.
fn process_dict_updates<T>(slots: &mut [Option<T>], u: BatchUpdate<Option<T>>) -> (bool, bool) {
    let mut updated = false;
    let mut updated_excl_self = false;
    for (index, state) in u.added {
        if state.is_some() {
            slots[index] = state;
            updated = true;
            updated_excl_self = true;
        } else if slots[index].take().is_some() {
            updated = true;
            updated_excl_self = true;
        }
    }
    if slots.iter().any(Option::is_some) {
        for index in u.removed {
            if slots[index].take().is_some() {
                updated = true;
                updated_excl_self = true;
            }
        }
        for m in u.moved {
            let real = m.from != m.to;
            let a = slots[m.from].take();
            let b = slots[m.to].take();
            if let Some(a) = a {
                slots[m.to] = Some(a);
                updated = true;
                updated_excl_self |= real;
            }
            if let Some(b) = b {
                updated = true;
                updated_excl_self |= real;
                if m.dir == MoveDirectionality::Swap {
                    slots[m.from] = Some(b);
                }
            }
        }
    }
    (updated, updated_excl_self)
}

/// vLLM 0.25.1 `MinPLogitsProcessor.update_state`, literally, on float32 values. Returns vLLM's
/// `needs_update` flag.
fn min_p_model(vals: &mut [f32], count: &mut usize, u: &BatchUpdate<f32>) -> bool {
    let mut needs_update = false;
    for &(index, min_p) in &u.added {
        let before = vals[index];
        if before != min_p {
            needs_update = true;
            vals[index] = min_p;
        }
        if min_p != 0.0 && before == 0.0 {
            *count += 1;
        } else if min_p == 0.0 && before != 0.0 {
            *count -= 1;
        }
    }
    if *count > 0 {
        if !u.removed.is_empty() {
            needs_update = true;
        }
        for &index in &u.removed {
            if vals[index] != 0.0 {
                vals[index] = 0.0;
                *count -= 1;
            }
        }
        for m in &u.moved {
            let (a, b) = (vals[m.from], vals[m.to]);
            if a != b {
                needs_update = true;
                vals[m.to] = a;
                if m.dir == MoveDirectionality::Swap {
                    vals[m.from] = b;
                }
            }
            if m.dir == MoveDirectionality::Unidirectional {
                if a != 0.0 {
                    vals[m.from] = 0.0;
                }
                if b != 0.0 {
                    *count -= 1;
                }
            }
        }
    }
    needs_update
}

type Bias = Vec<(i32, f32)>;
type Triple = (i32, i32, f32);

fn bias_state(r: &Req) -> Option<Bias> {
    if r.bias.is_empty() {
        None
    } else {
        Some(r.bias.iter().map(|&(t, b)| (t as i32, b as f32)).collect())
    }
}

struct MtEntry {
    min_tokens: usize,
    stop: Vec<i32>,
    output: SharedHistory,
}

/// vLLM's `MinTokensLogitsProcessor.add_request`: no entry when min_tokens is 0 or the output
/// is already long enough; stop ids deduplicated in first-seen order.
fn min_tokens_state(r: &Req) -> Option<MtEntry> {
    let min_tokens = r.min_tokens as usize;
    if min_tokens == 0 || r.output.len(&()) >= min_tokens {
        return None;
    }
    let mut stop = Vec::new();
    for &t in &r.stop {
        if !stop.contains(&(t as i32)) {
            stop.push(t as i32);
        }
    }
    Some(MtEntry {
        min_tokens,
        stop,
        output: r.output.clone(),
    })
}

fn flatten<T>(
    slots: &[Option<T>],
    batch_size: usize,
    entries: impl Fn(&T) -> Vec<(i32, f32)>,
) -> Vec<Triple> {
    slots[..batch_size]
        .iter()
        .enumerate()
        .filter_map(|(row, s)| s.as_ref().map(|s| (row, s)))
        .flat_map(|(row, s)| entries(s).into_iter().map(move |(t, v)| (row as i32, t, v)))
        .collect()
}

fn bias_flat(slots: &[Option<Bias>], bs: usize) -> Vec<Triple> {
    flatten(slots, bs, Clone::clone)
}

fn mt_flat(slots: &[Option<MtEntry>], bs: usize) -> Vec<Triple> {
    flatten(slots, bs, |e| {
        e.stop.iter().map(|&t| (t, f32::NEG_INFINITY)).collect()
    })
}

fn touched<T>(slots: &[Option<T>], a: usize, b: usize) -> bool {
    (a.min(b)..a.max(b)).any(|i| slots[i].is_some())
}

// ---------------------------------------------------------------------------------------------
// Snapshots of every observable (to prove a rejected update changed nothing)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
struct SparseSnap {
    len: usize,
    version: u64,
    rows: Vec<i32>,
    cols: Vec<i32>,
    vals: Vec<u32>,
}

fn sparse_snap(s: &SparseRows) -> SparseSnap {
    SparseSnap {
        len: s.len(),
        version: s.version(),
        rows: s.rows().to_vec(s.capacity()),
        cols: s.cols().to_vec(s.capacity()),
        vals: s
            .vals()
            .to_vec(s.capacity())
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    }
}

type TableSnap = (Vec<Option<u32>>, usize);

fn table_snap(t: &SlotTable<u32>) -> TableSnap {
    (
        (0..t.capacity()).map(|i| t.get(i).copied()).collect(),
        t.active(),
    )
}

type MinPSnap = (Vec<u32>, usize, usize, Vec<u32>);

fn min_p_snap(s: &MinPState) -> MinPSnap {
    let cap = s.capacity();
    (
        (0..cap).map(|i| s.get(i).unwrap().to_bits()).collect(),
        s.count(),
        s.batch_size(),
        s.log_min_p()
            .to_vec(cap)
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    )
}

type BiasSnap = (Vec<Option<Vec<(i32, u32)>>>, usize, SparseSnap);

fn bias_snap(s: &LogitBiasState) -> BiasSnap {
    (
        (0..s.capacity())
            .map(|i| {
                s.get(i)
                    .map(|e| e.iter().map(|&(t, b)| (t, b.to_bits())).collect())
            })
            .collect(),
        s.active(),
        sparse_snap(s.triples()),
    )
}

fn mt_snap<H: TokenHistory>(s: &MinTokensState<H>) -> (usize, SparseSnap) {
    (s.active(), sparse_snap(s.triples()))
}

// ---------------------------------------------------------------------------------------------
// The harness: the four states, their models, and the checks after every step
// ---------------------------------------------------------------------------------------------

struct Harness {
    cap: usize,
    step_no: usize,
    table: SlotTable<u32>,
    table_m: Vec<Option<u32>>,
    min_p: MinPState,
    min_p_m: Vec<f32>,
    min_p_count: usize,
    min_p_bs: usize,
    /// What a device copy holds: the `log_min_p` prefix as of the last `needs_copy`.
    min_p_dev: Vec<u32>,
    bias: LogitBiasState,
    bias_m: Vec<Option<Bias>>,
    bias_bs: usize,
    mt: MinTokensState<SharedHistory>,
    mt_m: Vec<Option<MtEntry>>,
    mt_bs: usize,
    /// The same three tables in one pipeline: it must accept exactly when all three do, and
    /// change nothing when any of them rejects; it must then equal three separate tables that
    /// were given only the updates all three accept (`atomic`).
    pipe: Pipeline<SharedHistory>,
    atomic: (MinPState, LogitBiasState, MinTokensState<SharedHistory>),
}

fn pipe_snap(p: &Pipeline<SharedHistory>) -> (MinPSnap, BiasSnap, (usize, SparseSnap)) {
    let t = p.tables();
    (
        min_p_snap(t.get::<MinPState>().expect("built")),
        bias_snap(&t.get::<LogitBiasTable>().expect("built").state),
        mt_snap(&t.get::<MinTokensTable>().expect("built").state),
    )
}

fn request_params(r: &Req) -> RequestParams<SharedHistory> {
    let mut p = RequestParams::neutral(Output {
        tokens: r.output.read().unwrap().clone(),
        source: Some(r.output.clone()),
    });
    p.set("min_p", Value::Float(r.min_p));
    p.set("logit_bias", Value::Bias(r.bias.clone()));
    p.set("min_tokens", Value::Int(r.min_tokens));
    p.set("stop_token_ids", Value::Ids(Some(r.stop.clone())));
    p
}

impl Harness {
    fn new(cap: usize) -> Self {
        Harness {
            cap,
            step_no: 0,
            table: SlotTable::new(cap),
            table_m: (0..cap).map(|_| None).collect(),
            min_p: MinPState::new(cap),
            min_p_m: vec![0.0; cap],
            min_p_count: 0,
            min_p_bs: 0,
            min_p_dev: vec![f32::NEG_INFINITY.to_bits(); cap],
            bias: LogitBiasState::new(cap, VOCAB, MAX_BIAS),
            bias_m: (0..cap).map(|_| None).collect(),
            bias_bs: 0,
            mt: MinTokensState::new(cap, VOCAB, MAX_STOP),
            mt_m: (0..cap).map(|_| None).collect(),
            mt_bs: 0,
            pipe: Pipeline::new(
                PipelineConfig::new(cap, VOCAB)
                    .with("min_p")
                    .with("logit_bias")
                    .with_cap("max_logit_bias_entries", MAX_BIAS)
                    .with("min_tokens")
                    .with_cap("max_stop_token_ids", MAX_STOP),
            )
            .expect("valid sizes"),
            atomic: (
                MinPState::new(cap),
                LogitBiasState::new(cap, VOCAB, MAX_BIAS),
                MinTokensState::new(cap, VOCAB, MAX_STOP),
            ),
        }
    }

    fn pipeline_step(&mut self, u: Option<&BatchUpdate<Req>>, ok: bool) {
        let n = self.step_no;
        let before = pipe_snap(&self.pipe);
        let res = match u {
            None => {
                self.pipe.update_none().expect("clean lists");
                self.atomic.2.update_none(&());
                Ok(())
            }
            Some(u) => self.pipe.update(project(u, request_params)),
        };
        if !ok {
            assert!(res.is_err(), "step {n}: the pipeline accepted {u:?}");
            assert_eq!(
                pipe_snap(&self.pipe),
                before,
                "step {n}: rejected update changed the pipeline"
            );
            return;
        }
        res.unwrap_or_else(|e| panic!("step {n}: the pipeline rejected: {e}"));
        if let Some(u) = u {
            let (mp, lb, mt) = &mut self.atomic;
            mp.update(project(u, |r| r.min_p))
                .expect("accepted by the pipeline");
            lb.update(project(u, |r| r.bias.clone()))
                .expect("accepted by the pipeline");
            mt.update(
                project(u, |r| MinTokensParams {
                    min_tokens: r.min_tokens,
                    stop_token_ids: r.stop.clone(),
                    output: r.output.clone(),
                    output_len: r.output.len(&()),
                }),
                &(),
            )
            .expect("accepted by the pipeline");
        }
        let (mp, lb, mt) = &self.atomic;
        let tables = (min_p_snap(mp), bias_snap(lb), mt_snap(mt));
        assert_eq!(
            pipe_snap(&self.pipe),
            tables,
            "step {n}: pipeline differs from its tables"
        );
    }

    /// One engine step: every state gets the same update (or `None`). States whose view of the
    /// update is invalid must reject it and stay exactly as they were; the others must match
    /// their model.
    fn step(&mut self, u: Option<&BatchUpdate<Req>>) {
        self.step_no += 1;
        match u {
            None => {
                self.min_tokens_none();
                self.pipeline_step(None, true);
            }
            Some(u) => {
                let ok = structurally_ok(u, self.cap);
                let mp = ok && u.added.iter().all(|(_, r)| min_p_ok(r));
                let lb = ok && u.added.iter().all(|(_, r)| bias_ok(r));
                let mt = ok && u.added.iter().all(|(_, r)| min_tokens_ok(r));
                self.table_step(u, ok);
                self.min_p_step(u, mp);
                self.bias_step(u, lb);
                self.min_tokens_step(u, mt);
                self.pipeline_step(Some(u), mp && lb && mt);
            }
        }
        self.check_models();
    }

    fn table_step(&mut self, u: &BatchUpdate<Req>, ok: bool) {
        let before = table_snap(&self.table);
        let res = self.table.apply(project(u, |r| r.tag));
        if !ok {
            assert!(
                res.is_err(),
                "step {}: SlotTable accepted {u:?}",
                self.step_no
            );
            assert_eq!(
                table_snap(&self.table),
                before,
                "rejected update changed SlotTable"
            );
            return;
        }
        let ret = res.unwrap_or_else(|e| panic!("step {}: SlotTable rejected: {e}", self.step_no));
        let old = self.table_m.clone();
        let (updated, updated_excl_self) =
            process_dict_updates(&mut self.table_m, project(u, |r| r.tag));
        assert_eq!(
            ret, updated_excl_self,
            "step {}: SlotTable::apply returned {ret}, vLLM's updated flag is {updated} \
             ({updated_excl_self} without self-moves) for {u:?}",
            self.step_no
        );
        if old != self.table_m {
            assert!(
                ret,
                "step {}: SlotTable changed but apply returned false",
                self.step_no
            );
        }
    }

    fn min_p_step(&mut self, u: &BatchUpdate<Req>, ok: bool) {
        let before = min_p_snap(&self.min_p);
        let res = self.min_p.update(project(u, |r| r.min_p));
        if !ok {
            assert!(
                res.is_err(),
                "step {}: MinPState accepted {u:?}",
                self.step_no
            );
            assert_eq!(
                min_p_snap(&self.min_p),
                before,
                "rejected update changed MinPState"
            );
            return;
        }
        let needs_copy = res
            .unwrap_or_else(|e| panic!("step {}: MinPState rejected: {e}", self.step_no))
            .needs_copy;
        let old = self.min_p_m.clone();
        let old_bs = self.min_p_bs;
        let vllm_needs_update = min_p_model(
            &mut self.min_p_m,
            &mut self.min_p_count,
            &project(u, |r| r.min_p as f32),
        );
        let bs = u.batch_size;
        self.min_p_bs = bs;
        let changed = |i: usize| old[i].to_bits() != self.min_p_m[i].to_bits();
        let prefix_changed = (0..bs).any(changed);
        let any_changed = (0..self.cap).any(changed);
        let resized = old_bs != bs;
        let count = self.min_p_count;
        if count > 0 && (prefix_changed || resized) {
            assert!(
                needs_copy,
                "step {}: MinP row in [0, {bs}) changed or batch size {old_bs} -> {bs}, \
                 count {count}, but needs_copy is false",
                self.step_no
            );
        }
        if needs_copy {
            assert!(
                count > 0 && (any_changed || resized || vllm_needs_update),
                "step {}: needs_copy without a change (count {count})",
                self.step_no
            );
            let log = self.min_p.log_min_p().to_vec(bs);
            for (d, v) in self.min_p_dev.iter_mut().zip(log) {
                *d = v.to_bits();
            }
        }
    }

    fn bias_step(&mut self, u: &BatchUpdate<Req>, ok: bool) {
        let before = bias_snap(&self.bias);
        let res = self.bias.update(project(u, |r| r.bias.clone()));
        if !ok {
            assert!(
                res.is_err(),
                "step {}: LogitBiasState accepted {u:?}",
                self.step_no
            );
            assert_eq!(
                bias_snap(&self.bias),
                before,
                "rejected update changed LogitBiasState"
            );
            return;
        }
        let ret =
            res.unwrap_or_else(|e| panic!("step {}: LogitBiasState rejected: {e}", self.step_no));
        let flat_before = bias_flat(&self.bias_m, self.bias_bs);
        let (updated, _) = process_dict_updates(&mut self.bias_m, project(u, bias_state));
        let old_bs = std::mem::replace(&mut self.bias_bs, u.batch_size);
        let flat_after = bias_flat(&self.bias_m, self.bias_bs);
        if flat_before != flat_after {
            assert!(
                ret,
                "step {}: bias triples changed but update returned false",
                self.step_no
            );
        }
        if ret {
            assert!(
                updated || touched(&self.bias_m, old_bs, self.bias_bs),
                "step {}: LogitBias rebuilt without a reason",
                self.step_no
            );
        }
        assert_eq!(
            self.bias.triples().version(),
            before.2.version + u64::from(ret),
            "step {}: version must count rebuilds",
            self.step_no
        );
    }

    fn min_tokens_step(&mut self, u: &BatchUpdate<Req>, ok: bool) {
        let before = mt_snap(&self.mt);
        let params = project(u, |r| MinTokensParams {
            min_tokens: r.min_tokens,
            stop_token_ids: r.stop.clone(),
            output: r.output.clone(),
            output_len: r.output.len(&()),
        });
        let res = self.mt.update(params, &());
        if !ok {
            assert!(
                res.is_err(),
                "step {}: MinTokensState accepted {u:?}",
                self.step_no
            );
            assert_eq!(
                mt_snap(&self.mt),
                before,
                "rejected update changed MinTokensState"
            );
            return;
        }
        let ret =
            res.unwrap_or_else(|e| panic!("step {}: MinTokensState rejected: {e}", self.step_no));
        let flat_before = mt_flat(&self.mt_m, self.mt_bs);
        let (updated, _) = process_dict_updates(&mut self.mt_m, project(u, min_tokens_state));
        let old_bs = std::mem::replace(&mut self.mt_bs, u.batch_size);
        let resize_touched = touched(&self.mt_m, old_bs, self.mt_bs);
        let dropped = self.min_tokens_retain();
        self.min_tokens_after(
            ret,
            flat_before,
            updated || resize_touched || dropped,
            before.1.version,
        );
    }

    fn min_tokens_none(&mut self) {
        let version = self.mt.triples().version();
        let ret = self.mt.update_none(&());
        let flat_before = mt_flat(&self.mt_m, self.mt_bs);
        let dropped = self.min_tokens_retain();
        self.min_tokens_after(ret, flat_before, dropped, version);
    }

    /// The per-step length check: drop entries whose output reached min_tokens.
    fn min_tokens_retain(&mut self) -> bool {
        let mut dropped = false;
        for s in self.mt_m.iter_mut() {
            if s.as_ref()
                .is_some_and(|e| e.output.len(&()) >= e.min_tokens)
            {
                *s = None;
                dropped = true;
            }
        }
        dropped
    }

    fn min_tokens_after(&self, ret: bool, flat_before: Vec<Triple>, reason: bool, version: u64) {
        let flat_after = mt_flat(&self.mt_m, self.mt_bs);
        if flat_before != flat_after {
            assert!(
                ret,
                "step {}: min-tokens triples changed but update returned false",
                self.step_no
            );
        }
        if ret {
            assert!(
                reason,
                "step {}: MinTokens rebuilt without a reason",
                self.step_no
            );
        }
        assert_eq!(self.mt.triples().version(), version + u64::from(ret));
    }

    /// Every observable of every state equals its model.
    fn check_models(&self) {
        let n = self.step_no;
        // SlotTable
        for (i, m) in self.table_m.iter().enumerate() {
            assert_eq!(
                self.table.get(i),
                m.as_ref(),
                "step {n}: SlotTable slot {i}"
            );
        }
        let active = self.table_m.iter().filter(|s| s.is_some()).count();
        assert_eq!(self.table.active(), active, "step {n}: SlotTable active");
        assert_eq!(self.table.iter().count(), active);
        assert!(self.table.get(self.cap).is_none());

        // MinP
        for (i, &v) in self.min_p_m.iter().enumerate() {
            let got = self.min_p.get(i).unwrap();
            assert_eq!(
                got.to_bits(),
                v.to_bits(),
                "step {n}: min_p slot {i}: {got} vs {v}"
            );
            let want = if v == 0.0 { f32::NEG_INFINITY } else { v.ln() };
            let log = self.min_p.log_min_p().get(i);
            assert_eq!(
                log.to_bits(),
                want.to_bits(),
                "step {n}: log_min_p slot {i}: {log} vs {want}"
            );
        }
        let nonzero = self.min_p_m.iter().filter(|v| **v != 0.0).count();
        assert_eq!(self.min_p_count, nonzero, "step {n}: model count drifted");
        assert_eq!(self.min_p.count(), nonzero, "step {n}: MinP count");
        assert_eq!(
            self.min_p.batch_size(),
            self.min_p_bs,
            "step {n}: MinP batch_size"
        );
        if nonzero > 0 {
            let bs = self.min_p_bs;
            let host: Vec<u32> = self
                .min_p
                .log_min_p()
                .to_vec(bs)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(
                &self.min_p_dev[..bs],
                &host[..],
                "step {n}: device copy of MinP is stale"
            );
        }

        // LogitBias
        for (i, m) in self.bias_m.iter().enumerate() {
            assert_eq!(self.bias.get(i), m.as_deref(), "step {n}: bias slot {i}");
        }
        let active = self.bias_m.iter().filter(|s| s.is_some()).count();
        assert_eq!(self.bias.active(), active, "step {n}: LogitBias active");
        assert_eq!(
            self.bias.triples().triples(),
            bias_flat(&self.bias_m, self.bias_bs),
            "step {n}: bias triples"
        );

        // MinTokens
        let active = self.mt_m.iter().filter(|s| s.is_some()).count();
        assert_eq!(self.mt.active(), active, "step {n}: MinTokens active");
        assert_eq!(
            self.mt.triples().triples(),
            mt_flat(&self.mt_m, self.mt_bs),
            "step {n}: min-tokens triples"
        );
    }

    /// End-to-end: after an engine step, slot `s` of every table holds the state of the request
    /// the engine put in slot `s`.
    fn check_engine(&self, slots: &[Option<Req>], batch_size: usize) {
        let n = self.step_no;
        for (s, r) in slots.iter().enumerate() {
            assert_eq!(
                self.table.get(s).copied(),
                r.as_ref().and_then(|r| r.tag),
                "step {n}: SlotTable slot {s} vs engine"
            );
            let want = r.as_ref().map_or(0.0, |r| r.min_p as f32);
            assert!(
                self.min_p.get(s) == Some(want),
                "step {n}: min_p slot {s} vs engine"
            );
            assert_eq!(
                self.bias.get(s).map(<[_]>::to_vec),
                r.as_ref().and_then(bias_state),
                "step {n}: bias slot {s} vs engine"
            );
        }
        let live: Vec<Option<MtEntry>> = slots
            .iter()
            .map(|r| r.as_ref().and_then(min_tokens_state))
            .collect();
        assert_eq!(
            self.mt.triples().triples(),
            mt_flat(&live, batch_size),
            "step {n}: min-tokens triples vs engine"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Engine generator: vLLM's InputBatch bookkeeping
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct EngineStep {
    /// Requests that finish (picks into the live slots).
    finish: Vec<u16>,
    /// New requests.
    arrive: Vec<ReqSpec>,
    /// Reorder swaps (picks into [0, num_reqs)).
    swaps: Vec<(u16, u16)>,
}

fn engine_step() -> impl Strategy<Value = EngineStep> {
    prop_oneof![
        1 => Just(EngineStep::default()),
        5 => (
            vec(any::<u16>(), 0..4),
            vec(req_spec(), 0..4),
            vec((any::<u16>(), any::<u16>()), 0..3),
        )
            .prop_map(|(finish, arrive, swaps)| EngineStep { finish, arrive, swaps }),
    ]
}

/// The persistent batch: slot -> request, and the builder that records one step's changes.
struct Engine {
    cap: usize,
    slots: Vec<Option<Req>>,
    num_reqs: usize,
    builder: BatchUpdateBuilder<Req>,
}

impl Engine {
    fn new(cap: usize) -> Self {
        Engine {
            cap,
            slots: vec![None; cap],
            num_reqs: 0,
            builder: BatchUpdateBuilder::new(),
        }
    }

    /// `_update_states` up to `refresh_metadata`: remove, add, condense, reorder, hand out.
    fn step(&mut self, spec: &EngineStep) -> Option<BatchUpdate<Req>> {
        // remove_request for finished requests.
        for &pick in &spec.finish {
            let live: Vec<usize> = (0..self.cap).filter(|&i| self.slots[i].is_some()).collect();
            if live.is_empty() {
                break;
            }
            let idx = live[pick as usize % live.len()];
            self.builder.removed_append(idx).unwrap();
            self.slots[idx] = None;
            self.num_reqs -= 1;
        }
        // add_request: lowest freed slot first, else the end of the batch.
        for r in &spec.arrive {
            if self.num_reqs == self.cap {
                break;
            }
            let idx = self.builder.pop_removed().unwrap_or(self.num_reqs);
            assert!(
                idx < self.cap && self.slots[idx].is_none(),
                "slot {idx} not free"
            );
            let req = Req::new(r);
            self.slots[idx] = Some(req.clone());
            self.builder.added.push((idx, req));
            self.num_reqs += 1;
        }
        // condense: UNIDIRECTIONAL moves from the tail into the holes.
        if !self.builder.removed().is_empty() && self.num_reqs > 0 {
            let mut last = self.num_reqs + self.builder.removed().len() - 1;
            loop {
                while self.builder.removed().contains(&last) {
                    last -= 1;
                }
                match self.builder.peek_removed() {
                    Some(e) if e < last => {
                        self.builder.pop_removed();
                        self.slots[e] = self.slots[last].take();
                        assert!(self.slots[e].is_some(), "condense moved an empty slot");
                        self.builder.moved.push(Move::unidirectional(last, e));
                        last -= 1;
                    }
                    _ => break,
                }
            }
        }
        for i in 0..self.cap {
            assert_eq!(
                self.slots[i].is_some(),
                i < self.num_reqs,
                "batch not dense"
            );
        }
        // Reorder: swap_states(i1, i2).
        if self.num_reqs >= 2 {
            for &(a, b) in &spec.swaps {
                let (i, j) = (a as usize % self.num_reqs, b as usize % self.num_reqs);
                if i != j {
                    self.slots.swap(i, j);
                    self.builder.moved.push(Move::swap(i, j));
                }
            }
        }
        let update = self.builder.get_and_reset(self.num_reqs);
        if let Some(u) = &update {
            check_update_invariants(u, self.cap);
        }
        update
    }

    /// Sampling: every live request produces one token.
    fn sample(&self) {
        for r in self.slots.iter().flatten() {
            r.push_token();
        }
    }
}

/// The invariants of an InputBatch-produced update (semantics note §9.3).
fn check_update_invariants(u: &BatchUpdate<Req>, cap: usize) {
    assert!(u.batch_size <= cap);
    assert!(
        u.removed.windows(2).all(|w| w[0] > w[1]),
        "removed not descending: {:?}",
        u.removed
    );
    assert!(
        u.removed.iter().all(|&i| i >= u.batch_size && i < cap),
        "removed below batch_size"
    );
    let added: Vec<usize> = u.added.iter().map(|(i, _)| *i).collect();
    assert!(
        u.removed.iter().all(|i| !added.contains(i)),
        "index both added and removed"
    );
    for m in &u.moved {
        if m.dir == MoveDirectionality::Unidirectional {
            assert!(m.to < m.from, "condense moves down");
            assert!(
                !added.contains(&m.from) && !added.contains(&m.to),
                "UNI touches an add"
            );
        } else {
            assert!(m.from < u.batch_size && m.to < u.batch_size && m.from != m.to);
        }
    }
}

fn run_engine(cap: usize, steps: &[EngineStep]) {
    let mut engine = Engine::new(cap);
    let mut h = Harness::new(cap);
    for spec in steps {
        let update = engine.step(spec);
        h.step(update.as_ref());
        h.check_engine(&engine.slots, engine.num_reqs);
        engine.sample();
    }
}

// ---------------------------------------------------------------------------------------------
// Arbitrary generator: any valid update, None steps, and invalid updates
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Kind {
    Valid,
    Nothing,
    Invalid(u8, u16),
}

#[derive(Clone, Debug)]
struct ArbStep {
    kind: Kind,
    batch_size: u16,
    removed: Vec<u16>,
    added: Vec<(u16, ReqSpec)>,
    /// (from, to, is_swap, is_self_move); self-moves are dropped from valid updates
    moved: Vec<(u16, u16, bool, bool)>,
    /// Bit i: history i (mod 64) grows by one token after this step.
    grow: u64,
}

fn arb_step() -> impl Strategy<Value = ArbStep> {
    (
        prop_oneof![
            12 => Just(Kind::Valid),
            3 => Just(Kind::Nothing),
            5 => (any::<u8>(), any::<u16>()).prop_map(|(c, x)| Kind::Invalid(c, x)),
        ],
        any::<u16>(),
        vec(any::<u16>(), 0..4),
        vec((any::<u16>(), req_spec()), 0..4),
        vec(
            (
                any::<u16>(),
                any::<u16>(),
                any::<bool>(),
                prop::bool::weighted(0.05),
            ),
            0..5,
        ),
        any::<u64>(),
    )
        .prop_map(|(kind, batch_size, removed, added, moved, grow)| ArbStep {
            kind,
            batch_size,
            removed,
            added,
            moved,
            grow,
        })
}

/// Number of ways `corrupt` breaks an update.
const CORRUPTIONS: u8 = 12;

impl ArbStep {
    /// A valid update over `cap` slots (all indices reduced mod `cap`, added indices unique).
    fn valid(&self, cap: usize, reqs: &mut Vec<Req>) -> BatchUpdate<Req> {
        let mut u = BatchUpdate::new(self.batch_size as usize % (cap + 1));
        u.removed = self.removed.iter().map(|&i| i as usize % cap).collect();
        for (i, spec) in &self.added {
            let i = *i as usize % cap;
            if u.added.iter().all(|(j, _)| *j != i) {
                let r = Req::new(spec);
                reqs.push(r.clone());
                u.added.push((i, r));
            }
        }
        u.moved = self
            .moved
            .iter()
            .filter_map(|&(a, b, swap, self_move)| {
                let from = a as usize % cap;
                let to = if self_move { from } else { b as usize % cap };
                // Self-moves are invalid (see self_moves_are_rejected_by_every_table).
                (from != to).then(|| {
                    if swap {
                        Move::swap(from, to)
                    } else {
                        Move::unidirectional(from, to)
                    }
                })
            })
            .collect();
        u
    }
}

/// Breaks a valid update in one way (`c`), with `x` choosing the details.
fn corrupt(u: &mut BatchUpdate<Req>, cap: usize, c: u8, x: u16) {
    let x = x as usize;
    let beyond = cap + x % 3;
    // The added request whose parameters get broken (one is added if there is none).
    let target = |u: &mut BatchUpdate<Req>| -> usize {
        if u.added.is_empty() {
            u.added.push((x % cap, Req::plain()));
        }
        x % u.added.len()
    };
    match c % CORRUPTIONS {
        0 => u.batch_size = cap + 1 + x % 3,
        1 => u.removed.insert(x % (u.removed.len() + 1), beyond),
        2 => u.added.push((beyond, Req::plain())),
        3 => u.moved.push(match x % 4 {
            0 => Move::unidirectional(beyond, 0),
            1 => Move::unidirectional(0, beyond),
            2 => Move::swap(beyond, 0),
            _ => Move::swap(0, beyond),
        }),
        4 => {
            let k = target(u);
            let i = u.added[k].0;
            u.added.push((i, Req::plain()));
        }
        5 => {
            let k = target(u);
            u.added[k].1.min_p = [f64::NAN, -0.01, 1.0001, f64::INFINITY, -1e-300][x % 5];
        }
        6 => {
            let k = target(u);
            let bad = [-1, VOCAB as i64, i64::MAX, i64::MIN, 1 << 40][x % 5];
            let bias = &mut u.added[k].1.bias;
            bias.truncate(MAX_BIAS - 1);
            bias.insert(x % (bias.len() + 1), (bad, 1.0));
        }
        7 => {
            let k = target(u);
            let bad = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][x % 3];
            let bias = &mut u.added[k].1.bias;
            bias.truncate(MAX_BIAS - 1);
            bias.push((3, bad));
        }
        8 => {
            let k = target(u);
            u.added[k].1.bias = (0..=MAX_BIAS as i64).map(|t| (t, 0.5)).collect();
        }
        9 => {
            let k = target(u);
            u.added[k].1.min_tokens = -1 - (x as i64 % 5);
        }
        10 => {
            let k = target(u);
            let bad = [-1, VOCAB as i64, i64::MAX][x % 3];
            let stop = &mut u.added[k].1.stop;
            stop.truncate(MAX_STOP - 1);
            stop.push(bad);
        }
        _ => {
            let k = target(u);
            u.added[k].1.stop = (0..=MAX_STOP as i64).collect();
        }
    }
}

fn run_arbitrary(cap: usize, steps: &[ArbStep]) {
    let mut h = Harness::new(cap);
    let mut reqs: Vec<Req> = Vec::new();
    for s in steps {
        match s.kind {
            Kind::Nothing => h.step(None),
            Kind::Valid => {
                let u = s.valid(cap, &mut reqs);
                assert!(structurally_ok(&u, cap));
                h.step(Some(&u));
            }
            Kind::Invalid(c, x) => {
                let mut u = s.valid(cap, &mut reqs);
                corrupt(&mut u, cap, c, x);
                let all_ok = structurally_ok(&u, cap)
                    && u.added
                        .iter()
                        .all(|(_, r)| min_p_ok(r) && bias_ok(r) && min_tokens_ok(r));
                assert!(!all_ok, "corruption {} left {u:?} valid", c % CORRUPTIONS);
                h.step(Some(&u));
            }
        }
        for (i, r) in reqs.iter().enumerate() {
            if s.grow >> (i % 64) & 1 == 1 {
                r.push_token();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn engine_small_batches(cap in 1usize..=10, steps in vec(engine_step(), 1..40)) {
        run_engine(cap, &steps);
    }

    #[test]
    fn arbitrary_updates(cap in 1usize..=10, steps in vec(arb_step(), 1..40)) {
        run_arbitrary(cap, &steps);
    }
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn engine_long_churn(cap in 16usize..=48, steps in vec(engine_step(), 60..150)) {
        run_engine(cap, &steps);
    }
}

// ---------------------------------------------------------------------------------------------
// BatchUpdateBuilder rules
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum BuilderOp {
    Append(u8),
    ReadRemoved,
    HasRemoved,
    Peek,
    Pop,
    PushAdded(u8),
    PushMoved(u8, u8, bool),
    MarkChanged,
    Reset,
    GetAndReset(u8),
}

fn builder_op() -> impl Strategy<Value = BuilderOp> {
    prop_oneof![
        5 => any::<u8>().prop_map(BuilderOp::Append),
        1 => Just(BuilderOp::ReadRemoved),
        1 => Just(BuilderOp::HasRemoved),
        2 => Just(BuilderOp::Peek),
        3 => Just(BuilderOp::Pop),
        2 => any::<u8>().prop_map(BuilderOp::PushAdded),
        1 => (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(a, b, s)| BuilderOp::PushMoved(a, b, s)),
        1 => Just(BuilderOp::MarkChanged),
        1 => Just(BuilderOp::Reset),
        2 => any::<u8>().prop_map(BuilderOp::GetAndReset),
    ]
}

/// vLLM's `BatchUpdateBuilder` (state.py:18-145), literally.
#[derive(Default)]
struct BuilderModel {
    removed: Vec<usize>,
    sorted: bool,
    added: Vec<(usize, u8)>,
    moved: Vec<Move>,
    batch_changed: bool,
}

impl BuilderModel {
    fn ensure_sorted(&mut self) {
        if !self.sorted {
            self.removed.sort_by(|a, b| b.cmp(a));
            self.sorted = true;
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn builder_follows_vllm(ops in vec(builder_op(), 0..60)) {
        let mut b: BatchUpdateBuilder<u8> = BatchUpdateBuilder::new();
        let mut m = BuilderModel::default();
        for op in ops {
            match op {
                BuilderOp::Append(i) => {
                    let res = b.removed_append(i as usize);
                    if m.sorted {
                        prop_assert_eq!(res, Err(Error::RemovedAfterRead));
                    } else {
                        prop_assert_eq!(res, Ok(()));
                        m.removed.push(i as usize);
                        m.batch_changed = true;
                    }
                }
                BuilderOp::ReadRemoved => {
                    m.ensure_sorted();
                    prop_assert_eq!(b.removed(), &m.removed[..]);
                }
                BuilderOp::HasRemoved => prop_assert_eq!(b.has_removed(), !m.removed.is_empty()),
                BuilderOp::Peek => {
                    let want = if m.removed.is_empty() {
                        None
                    } else {
                        m.ensure_sorted();
                        m.removed.last().copied()
                    };
                    prop_assert_eq!(b.peek_removed(), want);
                }
                BuilderOp::Pop => {
                    let want = if m.removed.is_empty() {
                        None
                    } else {
                        m.ensure_sorted();
                        m.removed.pop()
                    };
                    prop_assert_eq!(b.pop_removed(), want);
                }
                BuilderOp::PushAdded(i) => {
                    b.added.push((i as usize, i));
                    m.added.push((i as usize, i));
                }
                BuilderOp::PushMoved(x, y, swap) => {
                    let mv = if swap {
                        Move::swap(x as usize, y as usize)
                    } else {
                        Move::unidirectional(x as usize, y as usize)
                    };
                    b.moved.push(mv);
                    m.moved.push(mv);
                }
                BuilderOp::MarkChanged => {
                    b.mark_changed();
                    m.batch_changed = true;
                }
                BuilderOp::Reset => {
                    let want = std::mem::take(&mut m.batch_changed);
                    m.sorted = false;
                    m.removed.clear();
                    m.added.clear();
                    m.moved.clear();
                    prop_assert_eq!(b.reset(), want);
                }
                BuilderOp::GetAndReset(bs) => {
                    m.sorted = false;
                    m.batch_changed = false;
                    let want = if m.removed.is_empty() && m.added.is_empty() && m.moved.is_empty() {
                        None
                    } else {
                        Some(BatchUpdate {
                            batch_size: bs as usize,
                            removed: std::mem::take(&mut m.removed),
                            added: std::mem::take(&mut m.added),
                            moved: std::mem::take(&mut m.moved),
                        })
                    };
                    prop_assert_eq!(b.get_and_reset(bs as usize), want);
                }
            }
        }
    }

    /// Freed slots are handed out lowest first, whatever order they were freed in.
    #[test]
    fn builder_pops_lowest_first(mut freed in vec(0usize..1000, 0..30), take in 0usize..35) {
        let mut b: BatchUpdateBuilder<()> = BatchUpdateBuilder::new();
        for &i in &freed {
            b.removed_append(i).unwrap();
        }
        freed.sort_unstable();
        let popped: Vec<usize> = (0..take).map_while(|_| b.pop_removed()).collect();
        prop_assert_eq!(&popped[..], &freed[..take.min(freed.len())]);
        let mut rest = freed[popped.len()..].to_vec();
        rest.reverse();
        prop_assert_eq!(b.removed(), &rest[..]);
        let u = b.get_and_reset(5);
        prop_assert_eq!(u.map(|u| u.removed), (!rest.is_empty()).then_some(rest));
    }
}

#[test]
fn builder_rules() {
    let mut b: BatchUpdateBuilder<&str> = BatchUpdateBuilder::new();
    assert!(b.get_and_reset(0).is_none());
    // Removals registered in any order; the first read sorts them descending and closes
    // registration.
    for i in [4, 0, 7, 2] {
        b.removed_append(i).unwrap();
    }
    assert!(b.has_removed());
    assert_eq!(b.peek_removed(), Some(0));
    assert_eq!(b.removed_append(9), Err(Error::RemovedAfterRead));
    assert_eq!(b.pop_removed(), Some(0));
    b.added.push((0, "new"));
    assert_eq!(b.removed(), &[7, 4, 2]);
    b.moved.push(Move::unidirectional(7, 2));
    let u = b.get_and_reset(6).unwrap();
    assert_eq!(u.batch_size, 6);
    assert_eq!(u.removed, vec![7, 4, 2]);
    assert_eq!(u.added, vec![(0, "new")]);
    assert_eq!(u.moved, vec![Move::unidirectional(7, 2)]);
    // The next step starts empty and open.
    assert!(!b.has_removed());
    assert_eq!(b.peek_removed(), None);
    assert_eq!(b.pop_removed(), None);
    b.removed_append(3).unwrap();
    // A removal list that was never read is handed out as registered.
    b.removed_append(5).unwrap();
    assert_eq!(b.get_and_reset(1).unwrap().removed, vec![3, 5]);
    // mark_changed alone yields None (vLLM's get_and_reset ignores batch_changed), but reset()
    // reports it.
    b.mark_changed();
    assert!(b.get_and_reset(1).is_none());
    assert!(!b.reset());
    b.mark_changed();
    assert!(b.reset());
    // removed() on an empty list still closes registration until the next reset.
    assert!(b.removed().is_empty());
    assert_eq!(b.removed_append(1), Err(Error::RemovedAfterRead));
    assert!(!b.reset());
    b.removed_append(1).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Deterministic cases worth naming
// ---------------------------------------------------------------------------------------------

/// vLLM's example "fewer new requests than finished requests", as InputBatch really emits it:
/// the condensed-into slot is popped from `removed` and only shows up as a UNI destination
/// holding the removed request's stale state.
#[test]
fn condense_overwrites_stale_state() {
    let mut h = Harness::new(8);
    let mut engine = Engine::new(8);
    let spec = |tag: u32, min_p: f64| ReqSpec {
        tag: Some(tag),
        min_p,
        bias: vec![(tag as i64, 1.0)],
        min_tokens: 3,
        stop: vec![tag as i64],
        out_len: 0,
    };
    let first = EngineStep {
        arrive: (0..4).map(|t| spec(t, 0.1 * f64::from(t))).collect(),
        ..EngineStep::default()
    };
    let u = engine.step(&first).unwrap();
    h.step(Some(&u));
    h.check_engine(&engine.slots, 4);
    engine.sample();
    // Requests in slots 1 and 2 finish; one new request arrives (slot 1); 3 moves to 2.
    let second = EngineStep {
        finish: vec![1, 1],
        arrive: vec![spec(9, 0.9)],
        swaps: vec![(0, 1)],
    };
    let u = engine.step(&second).unwrap();
    assert!(u.removed.is_empty(), "{:?}", u.removed);
    assert_eq!(u.moved, vec![Move::unidirectional(3, 2), Move::swap(0, 1)]);
    assert_eq!(u.batch_size, 3);
    h.step(Some(&u));
    h.check_engine(&engine.slots, 3);
    assert_eq!(h.min_p.count(), 2); // slot 0's request had min_p 0
    assert_eq!(h.table.get(3), None);
}

/// A SWAP with one empty side moves the state; a UNI onto an occupied slot discards the
/// destination; adding "no state" onto a slot clears it.
#[test]
fn swap_with_empty_side_and_uni_onto_occupied() {
    let mut t: SlotTable<u32> = SlotTable::new(4);
    let mut u = BatchUpdate::new(4);
    u.added = vec![(0, Some(10)), (2, Some(12)), (3, Some(13))];
    assert!(t.apply(u).unwrap());
    let mut u = BatchUpdate::new(4);
    u.moved = vec![Move::swap(1, 0), Move::unidirectional(3, 2)];
    assert!(t.apply(u).unwrap());
    assert_eq!(
        (0..4).map(|i| t.get(i).copied()).collect::<Vec<_>>(),
        vec![None, Some(10), Some(13), None]
    );
    assert_eq!(t.active(), 2);
    let mut u = BatchUpdate::new(4);
    u.added = vec![(1, None)];
    assert!(t.apply(u).unwrap());
    assert_eq!(t.active(), 1);
}

/// Self-moves (`from == to`) never come out of InputBatch, but `validate` accepts them. Each
/// state follows its own vLLM code here, and the two disagree: `process_dict_updates` pops and
/// re-inserts (state kept; vLLM reports `updated`, `SlotTable` reports no change), while MinP's
/// UNI branch zeroes the source, which is the destination, so the min_p is dropped.
#[test]
fn self_moves_are_rejected_by_every_table() {
    // InputBatch never moves a slot onto itself, and vLLM's processors disagree on what one
    // would mean (MinP zeroes the slot, the dict-based ones keep it): the crate rejects it.
    let mut t: SlotTable<u32> = SlotTable::new(2);
    let mut u = BatchUpdate::new(2);
    u.added = vec![(0, Some(1))];
    t.apply(u).unwrap();
    for m in [Move::unidirectional(0, 0), Move::swap(0, 0)] {
        let mut u = BatchUpdate::new(2);
        u.moved = vec![m];
        let e = t.apply(u).unwrap_err().to_string();
        assert!(e.contains("index 0") && e.contains("moved"), "{e}");
        assert_eq!(t.get(0), Some(&1));
    }
    let mut s = MinPState::new(2);
    let mut u = BatchUpdate::new(2);
    u.added = vec![(0, 0.5)];
    s.update(u).unwrap();
    let mut u = BatchUpdate::new(2);
    u.moved = vec![Move::unidirectional(0, 0)];
    assert!(s.update(u).is_err());
    assert_eq!((s.get(0), s.count()), (Some(0.5), 1));
}

/// MinTokens re-checks live output lengths on `None` steps, and an add whose output is already
/// long enough creates no entry (and clears a stale one).
#[test]
fn min_tokens_tracks_live_outputs() {
    let out: SharedHistory = Arc::new(RwLock::new(vec![]));
    let long: SharedHistory = Arc::new(RwLock::new(vec![1, 2, 3]));
    let p = |min: i64, stop: Vec<i64>, o: &SharedHistory| MinTokensParams {
        min_tokens: min,
        stop_token_ids: stop,
        output: o.clone(),
        output_len: o.len(&()),
    };
    let mut s = MinTokensState::new(4, VOCAB, MAX_STOP);
    let mut u = BatchUpdate::new(2);
    u.added = vec![(0, p(2, vec![5, 5, 6], &out)), (1, p(3, vec![7], &long))];
    assert!(s.update(u, &()).unwrap());
    assert_eq!(
        s.triples().triples(),
        vec![(0, 5, f32::NEG_INFINITY), (0, 6, f32::NEG_INFINITY)]
    );
    out.write().unwrap().push(1);
    assert!(!s.update_none(&()));
    out.write().unwrap().push(1);
    assert!(s.update_none(&()));
    assert!(s.triples().is_empty());
    assert_eq!(s.active(), 0);
}

/// A bias beyond f32's range passes the "finite" check as f64 and is stored as +inf, which
/// turns the row's logits into inf (and NaN where min_tokens writes -inf). vLLM's OpenAI front
/// end clamps to [-100, 100]; the crate promises "finite values".
#[test]
fn logit_bias_outside_f32_range_is_rejected() {
    let mut s = LogitBiasState::new(2, VOCAB, MAX_BIAS);
    let mut u = BatchUpdate::new(1);
    u.added = vec![(0, vec![(1, 1e39)])];
    let res = s.update(u);
    assert!(
        res.is_err(),
        "accepted; stored bias = {:?}",
        s.get(0).map(|e| e[0].1)
    );
}
