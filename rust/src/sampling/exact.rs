//! The fused tail of `exact` (issue 41): per row, temperature, min-p, top-n-sigma, epsilon,
//! eta and top-k / top-p in one pass ([`super::fused::apply_steps_certified`]: temperature and
//! min-p bitwise the separate steps', each truncation only where no entry is within
//! [`super::fused::BOUNDARY_REL`] of its threshold, top-p `strict`; a row that is not certain
//! is left to the caller after min-p, with typical-p and XTC rows), then
//! vLLM 0.25.1's exponential race `argmax(softmax(x) / q)` on torch's own streams without
//! torch's softmax: the race runs on our float32 `e^(x - max)` and keeps its winner only where
//! it beats every other entry by more than [`CERTAIN_REL`] (the softmax's rounding cannot
//! overturn that). A row it cannot certify, and a row only the sort can mask, is left to the
//! caller with the state its stream had before the row's draws: the caller sorts it if need be,
//! takes torch's softmax of it and replays the race from that state ([`super::race::race_row`]).

use super::for_each_row_mut;
use super::fused::{apply_steps_certified, FusedScratch, RowParams};
use super::kept::RowOutcome;
use super::mt19937::Mt19937;
use super::race::{race_certified, walk_streams, StreamOf, Streams, CERTAIN_REL};

/// A row the caller must finish: its stream and that stream's state before the row's draws.
#[derive(Clone)]
pub struct LeftRow {
    pub row: usize,
    pub stream: StreamOf,
    pub state: Mt19937,
}

/// What the pass came to.
pub struct ExactOutcome {
    /// Per row; 0 for rows not needed and rows left.
    pub tokens: Vec<i64>,
    /// Rows whose top-k / top-p only the sort can decide (the other steps applied).
    pub needs_sort: Vec<usize>,
    /// Rows left as temperature and min-p made them: a truncation too close to call, or one
    /// not certified here (`fused::apply_steps_certified`); the caller runs the truncations'
    /// own steps, then top-k / top-p.
    pub truncate: Vec<usize>,
    /// Rows to draw with torch's softmax: the ones above, and those the race could not
    /// certify, in the order their streams drew them.
    pub left: Vec<LeftRow>,
}

/// The fused `exact` tail over `rows` rows of `data` (stride `row_stride`), in place:
/// `params(r)` gives each row's steps (temperature, min-p, the truncations where certain,
/// top-k, top-p), then the race of the `need`ed rows on
/// `streams` (the others only advance them). `margin`: [`CERTAIN_REL`] (tests widen it to
/// send every row to the caller).
#[allow(clippy::too_many_arguments)]
pub fn exact_fused(
    data: &mut [f32],
    rows: usize,
    vocab: usize,
    row_stride: usize,
    params: impl Fn(usize) -> RowParams + Sync,
    need: &[bool],
    streams: Streams<'_>,
    margin: Option<f64>,
) -> ExactOutcome {
    let outcomes = for_each_row_mut(
        data,
        rows,
        vocab,
        row_stride,
        rows * vocab,
        |row, r, s: &mut FusedScratch| apply_steps_certified(row, &params(r), s),
    );
    let margin = margin.unwrap_or(CERTAIN_REL);
    let mut tokens = vec![0i64; rows];
    let mut left = Vec::new();
    let mut words = Vec::new();
    walk_streams(
        rows,
        vocab,
        need,
        streams,
        &mut words,
        |r, stream, before, words| {
            let row = &data[r * row_stride..r * row_stride + vocab];
            let token = match outcomes[r] {
                None | Some(RowOutcome::NeedsSort) => None,
                Some(_) => race_certified(row, words, margin),
            };
            match token {
                Some(t) => tokens[r] = t as i64,
                None => left.push(LeftRow {
                    row: r,
                    stream,
                    state: before.clone(),
                }),
            }
        },
    );
    let rows_with = |want: Option<RowOutcome>| (0..rows).filter(|&r| outcomes[r] == want).collect();
    ExactOutcome {
        tokens,
        needs_sort: rows_with(Some(RowOutcome::NeedsSort)),
        truncate: rows_with(None),
        left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::race::race_row;

    fn rng(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The certified race on logits gives the plain race's token on the exact probabilities
    /// (float64 softmax rounded to float32) wherever it answers, and answers nearly always.
    #[test]
    fn certified_tokens_are_the_race_on_probabilities() {
        let mut seed = 3u64;
        let mut gen = Mt19937::from_seed(17);
        let (mut answered, mut cases) = (0, 0);
        for case in 0..400 {
            let v = [5usize, 64, 1000, 5000][case % 4];
            let scale = [0.5f32, 4.0, 12.0][case % 3];
            let row: Vec<f32> = (0..v).map(|_| rng(&mut seed) * scale).collect();
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let exps: Vec<f64> = row.iter().map(|&x| ((x - max) as f64).exp()).collect();
            let sum: f64 = exps.iter().sum();
            let probs: Vec<f32> = exps.iter().map(|&e| (e / sum) as f32).collect();
            let mut words = vec![0u32; 2 * v];
            gen.fill_raw(&mut words);
            cases += 1;
            if let Some(t) = race_certified(&row, &words, CERTAIN_REL) {
                answered += 1;
                assert_eq!(t, race_row(&probs, &words), "case {case}");
            }
        }
        assert!(answered * 100 >= cases * 99, "{answered} of {cases}");
    }

    #[test]
    fn rows_without_a_finite_softmax_are_left() {
        let mut gen = Mt19937::from_seed(1);
        let mut words = vec![0u32; 8];
        gen.fill_raw(&mut words);
        let inf = f32::INFINITY;
        for row in [
            [0.0, inf, 1.0, 2.0],
            [f32::NEG_INFINITY; 4],
            [0.0, f32::NAN, 1.0, 2.0],
        ] {
            assert_eq!(race_certified(&row, &words, CERTAIN_REL), None);
        }
    }

    /// Every row's stream state is the one before its draws: replaying from it gives the same
    /// words; a margin no race meets leaves every needed row.
    #[test]
    fn left_rows_carry_their_stream_state() {
        let (rows, vocab) = (3, 50);
        let mut seed = 8u64;
        let mut data: Vec<f32> = (0..rows * vocab).map(|_| rng(&mut seed) * 3.0).collect();
        let mut default = Mt19937::from_seed(5);
        let mut gens = [Mt19937::from_seed(6)];
        let start = default.clone();
        let out = exact_fused(
            &mut data,
            rows,
            vocab,
            vocab,
            |_| RowParams::default(),
            &[true, false, true],
            Streams {
                default: Some(&mut default),
                seeded: &[(2, 0)],
                generators: &mut gens,
            },
            Some(1e300),
        );
        let rows_left: Vec<_> = out.left.iter().map(|l| (l.row, l.stream)).collect();
        assert_eq!(
            rows_left,
            vec![(0, StreamOf::Default), (2, StreamOf::Seeded(0))]
        );
        let (mut a, mut b) = (vec![0u32; 4], vec![0u32; 4]);
        out.left[0].state.clone().fill_raw(&mut a);
        start.clone().fill_raw(&mut b);
        assert_eq!(a, b);
        out.left[1].state.clone().fill_raw(&mut a);
        Mt19937::from_seed(6).fill_raw(&mut b);
        assert_eq!(a, b);
    }
}
