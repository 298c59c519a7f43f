//! Bindings of the sort-free sampling tail (`crate::sampling`): module functions over the
//! memory of CPU tensors the Python caller (`logitsproc_rs/_tail.py`) has checked (float32,
//! CPU, unit column stride, the shape given). The work runs with the GIL released.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::buffer::logits_rows;
use crate::sampling::exact::exact_fused;
use crate::sampling::for_each_row_mut;
use crate::sampling::fused::{fused_row, FusedScratch, RowParams};
use crate::sampling::kept::{mask_row, RowOutcome, Scratch};
use crate::sampling::mt19937::Mt19937;
use crate::sampling::noise::{gumbel, gumbel_race_row, row_key, token_bits};
use crate::sampling::race::{exponential_race as race, RaceScratch, StreamOf, Streams};
use crate::sampling::sorted::sort_values;

/// `Err` unless a per-row argument (`None`: not given) has one entry per row.
fn per_row<T>(v: Option<&[T]>, rows: usize, name: &str) -> PyResult<()> {
    match v {
        Some(v) if v.len() != rows => Err(PyValueError::new_err(format!(
            "{name}: {} entries for {rows} rows",
            v.len()
        ))),
        _ => Ok(()),
    }
}

/// Row `r`'s top-k as the kept-set code reads it: `None` (off) where unset or `<= 0`.
fn row_top_k(top_k: &Option<Vec<i64>>, r: usize) -> Option<usize> {
    top_k
        .as_ref()
        .map(|k| k[r])
        .filter(|&k| k > 0)
        .map(|k| k as usize)
}

/// Top-k (`top_k[r] >= vocab`: off) and top-p (`top_p[r] >= 1`: off) kept sets, masked to
/// -inf in place; returns the rows left untouched because only the sort can decide them
/// (`strict`), and the rows masked by an uncertain float64 decision (not `strict`).
#[pyfunction]
#[pyo3(signature = (ptr, rows, vocab, row_stride, top_k=None, top_p=None, strict=true))]
pub fn unsafe_mask_top_k_top_p(
    py: Python<'_>,
    ptr: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    top_k: Option<Vec<i64>>,
    top_p: Option<Vec<f32>>,
    strict: bool,
) -> PyResult<(Vec<usize>, Vec<usize>)> {
    per_row(top_k.as_deref(), rows, "top_k")?;
    per_row(top_p.as_deref(), rows, "top_p")?;
    // SAFETY: the Python caller checked the tensor (see the module docs).
    let data = unsafe { logits_rows::<f32>(ptr, rows, vocab, row_stride)? };
    let outcomes = py.detach(|| {
        for_each_row_mut(
            data,
            rows,
            vocab,
            row_stride,
            rows * vocab,
            |row, r, s: &mut Scratch| {
                let p = top_p.as_ref().map(|p| p[r]);
                mask_row(row, row_top_k(&top_k, r), p, strict, s)
            },
        )
    });
    let rows_with = |want: RowOutcome| -> Vec<usize> {
        let hits = outcomes.iter().enumerate().filter(|(_, o)| **o == want);
        hits.map(|(r, _)| r).collect()
    };
    Ok((
        rows_with(RowOutcome::NeedsSort),
        rows_with(RowOutcome::MaskedUncertain),
    ))
}

/// The tokens, the default generator's state after the draws, each seeded one's.
type RaceOutcome<'py> = (
    Vec<i64>,
    Option<Bound<'py, PyBytes>>,
    Vec<Bound<'py, PyBytes>>,
);

fn generator(bytes: &[u8]) -> PyResult<Mt19937> {
    Mt19937::from_torch_state(bytes).map_err(|e| PyValueError::new_err(e.0))
}

fn state_bytes<'py>(py: Python<'py>, old: &[u8], g: &Mt19937) -> Bound<'py, PyBytes> {
    let mut out = old.to_vec();
    g.write_torch_state(&mut out);
    PyBytes::new(py, &out)
}

/// vLLM 0.25.1's `random_sample` on torch's CPU streams: `default_state` (the default
/// generator's `get_state()` bytes, `None` when every row has its own), `seeded` as `(row,
/// index into states)` in the generators' dict order. Returns the tokens and the states after
/// the draws (write them back with `set_state`).
#[pyfunction]
pub fn unsafe_exponential_race<'py>(
    py: Python<'py>,
    ptr: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    need: Vec<bool>,
    default_state: Option<Vec<u8>>,
    seeded: Vec<(usize, usize)>,
    states: Vec<Vec<u8>>,
) -> PyResult<RaceOutcome<'py>> {
    per_row(Some(&need), rows, "need")?;
    let (mut default, mut gens) = generators(rows, &default_state, &seeded, &states)?;
    // SAFETY: the Python caller checked the tensor (see the module docs).
    let probs: &[f32] = unsafe { logits_rows::<f32>(ptr, rows, vocab, row_stride)? };
    let tokens = py.detach(|| {
        let streams = Streams {
            default: default.as_mut(),
            seeded: &seeded,
            generators: &mut gens,
        };
        race(
            probs,
            rows,
            vocab,
            row_stride,
            &need,
            streams,
            &mut RaceScratch::default(),
        )
    });
    let (default_out, outs) = states_after(py, &default_state, &default, &states, &gens);
    Ok((tokens, default_out, outs))
}

/// The default generator (from `default_state`, `None` when every row has its own) and the
/// seeded ones (`states`), `Err` where `seeded` names a row or generator that is not there.
fn generators(
    rows: usize,
    default_state: &Option<Vec<u8>>,
    seeded: &[(usize, usize)],
    states: &[Vec<u8>],
) -> PyResult<(Option<Mt19937>, Vec<Mt19937>)> {
    if let Some(&(r, g)) = seeded
        .iter()
        .find(|&&(r, g)| r >= rows || g >= states.len())
    {
        return Err(PyValueError::new_err(format!(
            "seeded row {r} (generator {g}) outside {rows} rows / {} generators",
            states.len()
        )));
    }
    let default = default_state.as_deref().map(generator).transpose()?;
    let gens = states
        .iter()
        .map(|s| generator(s))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((default, gens))
}

/// The generators' states as torch's bytes (each over its own old bytes).
fn states_after<'py>(
    py: Python<'py>,
    default_state: &Option<Vec<u8>>,
    default: &Option<Mt19937>,
    states: &[Vec<u8>],
    gens: &[Mt19937],
) -> (Option<Bound<'py, PyBytes>>, Vec<Bound<'py, PyBytes>>) {
    let default_out = match (default_state, default) {
        (Some(old), Some(g)) => Some(state_bytes(py, old, g)),
        _ => None,
    };
    let outs = states
        .iter()
        .zip(gens)
        .map(|(old, g)| state_bytes(py, old, g))
        .collect();
    (default_out, outs)
}

/// [`RaceOutcome`], the rows only the sort can mask, the rows left for the truncations' own
/// steps and the rows to draw with torch's softmax, each with its stream's state before its
/// draws.
type FusedRaceOutcome<'py> = (
    Vec<i64>,
    Option<Bound<'py, PyBytes>>,
    Vec<Bound<'py, PyBytes>>,
    Vec<usize>,
    Vec<usize>,
    Vec<(usize, Bound<'py, PyBytes>)>,
);

/// The fused `exact` tail (`crate::sampling::exact`) over every row, in place: the steps of
/// `unsafe_fused_gumbel` (top-p strict, the truncations certified), then vLLM 0.25.1's race
/// for the `need`ed rows on the streams of `unsafe_exponential_race`. Returns its tokens and
/// states, the rows left for the sort (not masked by top-k / top-p), the rows left after
/// min-p (a truncation too close to call, typical-p, XTC) and the rows to draw with torch's
/// softmax from the state given (those two kinds when needed, and the races too close to
/// call). `margin`: the certainty the race needs (tests only).
#[pyfunction]
#[pyo3(signature = (
    ptr, rows, vocab, row_stride, need, default_state, seeded, states, temperature=None,
    steps=HashMap::new(), top_k=None, top_p=None, margin=None
))]
pub fn unsafe_fused_exponential<'py>(
    py: Python<'py>,
    ptr: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    need: Vec<bool>,
    default_state: Option<Vec<u8>>,
    seeded: Vec<(usize, usize)>,
    states: Vec<Vec<u8>>,
    temperature: Option<Vec<f32>>,
    steps: HashMap<String, Vec<f32>>,
    top_k: Option<Vec<i64>>,
    top_p: Option<Vec<f32>>,
    margin: Option<f64>,
) -> PyResult<FusedRaceOutcome<'py>> {
    per_row(Some(&need), rows, "need")?;
    let steps = Steps::new(rows, temperature, steps, top_k, top_p)?;
    let (mut default, mut gens) = generators(rows, &default_state, &seeded, &states)?;
    // SAFETY: the Python caller checked the tensor (see the module docs).
    let data = unsafe { logits_rows::<f32>(ptr, rows, vocab, row_stride)? };
    let out = py.detach(|| {
        let streams = Streams {
            default: default.as_mut(),
            seeded: &seeded,
            generators: &mut gens,
        };
        let params = |r: usize| steps.row(r);
        exact_fused(
            data, rows, vocab, row_stride, params, &need, streams, margin,
        )
    });
    let left = out
        .left
        .iter()
        .map(|l| {
            let old = match l.stream {
                StreamOf::Default => default_state.as_deref().unwrap_or_default(),
                StreamOf::Seeded(g) => &states[g],
            };
            (l.row, state_bytes(py, old, &l.state))
        })
        .collect();
    let (default_out, outs) = states_after(py, &default_state, &default, &states, &gens);
    Ok((
        out.tokens,
        default_out,
        outs,
        out.needs_sort,
        out.truncate,
        left,
    ))
}

/// The batch-invariant Gumbel race over each needed row's finite entries, keyed by
/// (`seeds[r]`, `positions[r]`) (64-bit patterns); rows without a finite entry and rows not
/// needed get token 0.
#[pyfunction]
pub fn unsafe_gumbel_race(
    py: Python<'_>,
    ptr: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    need: Vec<bool>,
    seeds: Vec<i64>,
    positions: Vec<i64>,
) -> PyResult<Vec<i64>> {
    per_row(Some(&need), rows, "need")?;
    per_row(Some(&seeds), rows, "seeds")?;
    per_row(Some(&positions), rows, "positions")?;
    // SAFETY: the Python caller checked the tensor (see the module docs).
    let data = unsafe { logits_rows::<f32>(ptr, rows, vocab, row_stride)? };
    Ok(py.detach(|| {
        for_each_row_mut(
            data,
            rows,
            vocab,
            row_stride,
            rows * vocab,
            |row, r, _: &mut ()| {
                if !need[r] {
                    return 0;
                }
                let key = row_key(seeds[r] as u64, positions[r] as u64);
                gumbel_race_row(row, key).map_or(0, |i| i as i64)
            },
        )
    }))
}

/// The per-row values of the fused tails' steps, as given (`None`: no row sets it; else one
/// entry per row, neutral where unset).
struct Steps {
    temperature: Option<Vec<f32>>,
    log_min_p: Option<Vec<f32>>,
    top_n_sigma: Option<Vec<f32>>,
    typical_p: Option<Vec<f32>>,
    epsilon: Option<Vec<f32>>,
    eta: Option<Vec<f32>>,
    xtc_probability: Option<Vec<f32>>,
    xtc_threshold: Option<Vec<f32>>,
    xtc_u: Option<Vec<f32>>,
    top_k: Option<Vec<i64>>,
    top_p: Option<Vec<f32>>,
}

impl Steps {
    /// The steps of a call: `temperature`, `top_k`, `top_p`, and the plan's `steps` by their
    /// keyword (`_fused.FUSED`'s): each one entry per row. `Err` naming an unknown keyword or
    /// the first argument without one entry per row.
    fn new(
        rows: usize,
        temperature: Option<Vec<f32>>,
        steps: HashMap<String, Vec<f32>>,
        top_k: Option<Vec<i64>>,
        top_p: Option<Vec<f32>>,
    ) -> PyResult<Self> {
        per_row(temperature.as_deref(), rows, "temperature")?;
        per_row(top_k.as_deref(), rows, "top_k")?;
        per_row(top_p.as_deref(), rows, "top_p")?;
        let mut out = Steps {
            temperature,
            log_min_p: None,
            top_n_sigma: None,
            typical_p: None,
            epsilon: None,
            eta: None,
            xtc_probability: None,
            xtc_threshold: None,
            xtc_u: None,
            top_k,
            top_p,
        };
        for (name, values) in steps {
            per_row(Some(&values), rows, &name)?;
            let slot = match name.as_str() {
                "log_min_p" => &mut out.log_min_p,
                "top_n_sigma" => &mut out.top_n_sigma,
                "typical_p" => &mut out.typical_p,
                "epsilon" => &mut out.epsilon,
                "eta" => &mut out.eta,
                "xtc_probability" => &mut out.xtc_probability,
                "xtc_threshold" => &mut out.xtc_threshold,
                "xtc_u" => &mut out.xtc_u,
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "fused steps: no step {name:?}"
                    )))
                }
            };
            *slot = Some(values);
        }
        Ok(out)
    }

    /// Row `r`'s steps.
    fn row(&self, r: usize) -> RowParams {
        let at = |v: &Option<Vec<f32>>, neutral: f32| v.as_ref().map_or(neutral, |v| v[r]);
        let off = RowParams::default();
        RowParams {
            temperature: at(&self.temperature, off.temperature),
            log_min_p: at(&self.log_min_p, off.log_min_p),
            top_n_sigma: at(&self.top_n_sigma, off.top_n_sigma),
            typical_p: at(&self.typical_p, off.typical_p),
            epsilon: at(&self.epsilon, off.epsilon),
            eta: at(&self.eta, off.eta),
            xtc_probability: at(&self.xtc_probability, off.xtc_probability),
            xtc_threshold: at(&self.xtc_threshold, off.xtc_threshold),
            xtc_u: at(&self.xtc_u, off.xtc_u),
            top_k: row_top_k(&self.top_k, r),
            top_p: self.top_p.as_ref().map(|p| p[r]),
        }
    }
}

/// The fused `batch_invariant` tail (`crate::sampling::fused`) over every row, in place:
/// temperature (divisors), the plan's `steps` by keyword (`ln min_p` as `log_min_p`,
/// `top_n_sigma`, `typical_p`, `epsilon`, `eta`, XTC's `xtc_probability`, `xtc_threshold` and
/// the row's uniform draw `xtc_u`), top-k, top-p (each absent or `None` when no row sets it,
/// else one entry per row, neutral where unset), then the Gumbel draw of the `need`ed rows
/// keyed by (`seeds[r]`, `positions[r]`). Returns the tokens (0 for rows not drawn), the rows
/// left for the sort (their other steps applied, not drawn) and the rows masked by an
/// uncertain top-p decision.
#[pyfunction]
#[pyo3(signature = (
    ptr, rows, vocab, row_stride, need, seeds, positions, temperature=None,
    steps=HashMap::new(), top_k=None, top_p=None
))]
pub fn unsafe_fused_gumbel(
    py: Python<'_>,
    ptr: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    need: Vec<bool>,
    seeds: Vec<i64>,
    positions: Vec<i64>,
    temperature: Option<Vec<f32>>,
    steps: HashMap<String, Vec<f32>>,
    top_k: Option<Vec<i64>>,
    top_p: Option<Vec<f32>>,
) -> PyResult<(Vec<i64>, Vec<usize>, Vec<usize>)> {
    per_row(Some(&need), rows, "need")?;
    per_row(Some(&seeds), rows, "seeds")?;
    per_row(Some(&positions), rows, "positions")?;
    let steps = Steps::new(rows, temperature, steps, top_k, top_p)?;
    // SAFETY: the Python caller checked the tensor (see the module docs).
    let data = unsafe { logits_rows::<f32>(ptr, rows, vocab, row_stride)? };
    let results = py.detach(|| {
        for_each_row_mut(
            data,
            rows,
            vocab,
            row_stride,
            rows * vocab,
            |row, r, s: &mut FusedScratch| {
                let key = need[r].then(|| row_key(seeds[r] as u64, positions[r] as u64));
                fused_row(row, &steps.row(r), key, s)
            },
        )
    });
    let tokens = results
        .iter()
        .map(|x| x.token.map_or(0, |t| t as i64))
        .collect();
    let rows_with = |want: RowOutcome| -> Vec<usize> {
        let hits = results
            .iter()
            .enumerate()
            .filter(|(_, x)| x.outcome == want);
        hits.map(|(r, _)| r).collect()
    };
    Ok((
        tokens,
        rows_with(RowOutcome::NeedsSort),
        rows_with(RowOutcome::MaskedUncertain),
    ))
}

/// The values of rows `which` of the logits at `ptr` (`rows` x `vocab`, stride `row_stride`),
/// each in ascending order (`crate::sampling::sorted`), into the contiguous float32 tensor at
/// `out_ptr` (`which.len()` x `vocab`, checked by the caller). NaN-free rows only.
#[pyfunction]
pub fn unsafe_sorted_values(
    py: Python<'_>,
    ptr: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    which: Vec<usize>,
    out_ptr: usize,
) -> PyResult<()> {
    if let Some(&r) = which.iter().find(|&&r| r >= rows) {
        return Err(PyValueError::new_err(format!(
            "row {r} outside {rows} rows"
        )));
    }
    // SAFETY: the Python caller checked both tensors (see the module docs); they do not
    // overlap (the output is a new tensor).
    let (src, out) = unsafe {
        (
            &*logits_rows::<f32>(ptr, rows, vocab, row_stride)?,
            logits_rows::<f32>(out_ptr, which.len(), vocab, vocab)?,
        )
    };
    py.detach(|| {
        for_each_row_mut(
            out,
            which.len(),
            vocab,
            vocab,
            which.len() * vocab,
            |dst, j, s: &mut (Vec<f32>, Vec<u32>)| {
                let at = which[j] * row_stride;
                sort_values(&src[at..at + vocab], &mut s.0, &mut s.1);
                dst.copy_from_slice(&s.0);
            },
        )
    });
    Ok(())
}

/// The noise of the batch-invariant race for `tokens` at (`seed`, `position`): the 32 bits and
/// the Gumbel value of each (for cross-checks against other implementations).
#[pyfunction]
pub fn gumbel_noise(seed: i64, position: i64, tokens: Vec<u32>) -> (Vec<u32>, Vec<f32>) {
    let key = row_key(seed as u64, position as u64);
    let bits: Vec<u32> = tokens.iter().map(|&t| token_bits(key, t)).collect();
    let g = bits.iter().map(|&b| gumbel(b)).collect();
    (bits, g)
}

/// The first `n` draws torch's float32 CPU `exponential_` makes from the generator whose
/// `get_state()` bytes are `state`, as this crate computes them (a self-check: `_tail.py`
/// compares them with torch's own before it trusts the race to reproduce torch).
#[pyfunction]
pub fn exponential_draws(state: Vec<u8>, n: usize) -> PyResult<Vec<f32>> {
    use crate::sampling::mt19937::{exponential_f32, uniform53};
    let mut g = generator(&state)?;
    Ok((0..n)
        .map(|_| {
            let hi = g.next_u32();
            exponential_f32(uniform53(hi, g.next_u32()))
        })
        .collect())
}

/// The margin within which the strict top-p decision is left to the sort, at `thr = 1 - p`
/// (`crate::sampling::kept`), in probability.
#[pyfunction]
pub fn top_p_margin(thr: f64) -> f64 {
    use crate::sampling::kept::{TOP_P_MARGIN_ABS, TOP_P_MARGIN_REL};
    TOP_P_MARGIN_ABS + TOP_P_MARGIN_REL * thr
}
