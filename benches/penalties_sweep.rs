//! Per-step cost of the output-reading states at B = 256 as outputs grow: penalties (counts
//! from the new tokens only), bad words and the thinking budget — the bookkeeping must not
//! grow with the output length. Each request starts with `L` generated tokens (L = 16, 256,
//! 1,024, 4,096) and a 64-token prompt; each timed step appends one token to every output
//! (untimed) and runs the states' per-step update (`update_none`, plus draining the penalty
//! additions). `penalties_apply_cpu/L` is the CPU apply on a [256, 32,000] float32 buffer,
//! which touches only the tokens each request has seen.

use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use logitsproc_rs::batch::BatchUpdate;
use logitsproc_rs::history::SharedHistory;
use logitsproc_rs::tables::bad_words::{BadWordsParams, BadWordsState};
use logitsproc_rs::tables::penalties::{PenaltiesState, PenaltyParams};
use logitsproc_rs::tables::thinking::{ThinkingConfig, ThinkingParams, ThinkingState};

const B: usize = 256;
const VOCAB: usize = 32_000;
const LENGTHS: [usize; 4] = [16, 256, 1024, 4096];

fn token(i: usize, r: usize) -> i64 {
    ((i * 7919 + r * 104_729) % VOCAB) as i64
}

struct World {
    outputs: Vec<SharedHistory>,
    penalties: PenaltiesState<SharedHistory>,
    bad_words: BadWordsState<SharedHistory>,
    thinking: ThinkingState<SharedHistory>,
    step: usize,
}

impl World {
    fn new(len: usize) -> Self {
        let outputs: Vec<SharedHistory> = (0..B)
            .map(|r| Arc::new(RwLock::new((0..len).map(|i| token(i, r)).collect())))
            .collect();
        let prompt = |r: usize| (0..64).map(|i| token(i + 100_000, r)).collect::<Vec<_>>();
        let mut penalties = PenaltiesState::new(B, VOCAB, 4 * B);
        let mut u = BatchUpdate::new(B);
        u.added = (0..B)
            .map(|r| {
                let p = PenaltyParams {
                    repetition_penalty: 1.2,
                    frequency_penalty: 0.5,
                    presence_penalty: 0.25,
                    last_n: None,
                    prompt: Some(prompt(r)),
                    output: outputs[r].clone(),
                };
                (r, p)
            })
            .collect();
        penalties.update(u, &()).unwrap();
        while penalties.next_chunk() > 0 {}
        let mut bad_words = BadWordsState::new(B, VOCAB, 8, 4);
        let mut u = BatchUpdate::new(B);
        u.added = (0..B)
            .map(|r| {
                let words = vec![vec![5], vec![token(1, r), 7], vec![1, 2, 3]];
                (
                    r,
                    BadWordsParams {
                        words,
                        output: outputs[r].clone(),
                    },
                )
            })
            .collect();
        bad_words.update(u, &()).unwrap();
        let config = ThinkingConfig {
            start_ids: vec![11],
            end_ids: vec![12, 13],
        };
        let mut thinking = ThinkingState::new(B, VOCAB, config).unwrap();
        let mut u = BatchUpdate::new(B);
        u.added = (0..B)
            .map(|r| {
                let p = ThinkingParams {
                    budget: Some(1 << 20),
                    prompt: Some(vec![11]),
                    output: outputs[r].clone(),
                };
                (r, p)
            })
            .collect();
        thinking.update(u).unwrap();
        thinking.step(B, &());
        World {
            outputs,
            penalties,
            bad_words,
            thinking,
            step: len,
        }
    }

    fn grow(&mut self) {
        self.step += 1;
        for (r, o) in self.outputs.iter().enumerate() {
            o.write().unwrap().push(token(self.step, r));
        }
    }
}

fn timed_steps(iters: u64, world: &mut World, mut f: impl FnMut(&mut World)) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        world.grow();
        let t = Instant::now();
        f(world);
        total += t.elapsed();
    }
    total
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("per_step");
    g.sample_size(20).measurement_time(Duration::from_secs(2));
    for len in LENGTHS {
        let mut world = World::new(len);
        g.bench_function(BenchmarkId::new("penalties_update", len), |b| {
            b.iter_custom(|iters| {
                timed_steps(iters, &mut world, |w| {
                    w.penalties.update_none(&());
                    while black_box(w.penalties.next_chunk()) > 0 {}
                })
            })
        });
        g.bench_function(BenchmarkId::new("bad_words_update", len), |b| {
            b.iter_custom(|iters| {
                timed_steps(iters, &mut world, |w| {
                    black_box(w.bad_words.update_none(&()));
                })
            })
        });
        g.bench_function(BenchmarkId::new("thinking_step", len), |b| {
            b.iter_custom(|iters| {
                timed_steps(iters, &mut world, |w| {
                    black_box(w.thinking.step(B, &()));
                })
            })
        });
        let world = World::new(len); // outputs of exactly `len` tokens
        let mut logits = vec![0.5f32; B * VOCAB];
        g.bench_function(BenchmarkId::new("penalties_apply_cpu", len), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    logits.fill(0.5); // fresh logits each step (untimed)
                    let t = Instant::now();
                    world
                        .penalties
                        .apply_to_rows(black_box(&mut logits), B, VOCAB, VOCAB, None);
                    total += t.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(penalties_sweep, benches);
criterion_main!(penalties_sweep);
