//! The whole pipeline's per-step cost in Rust alone (no Python): every built-in table, the
//! token feed, ordinary churn (about 1 in 64 requests finishing per step, each finished slot
//! refilled at once, every live request sampling one token per step), B = 64, 256 and 1,024.
//! What the Python path adds on top is in `make bench-python` (`bench-report.md`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use logitsproc_rs::batch::BatchUpdate;
use logitsproc_rs::fields::Value;
use logitsproc_rs::history::SharedHistory;
use logitsproc_rs::pipeline::{Output, Pipeline, PipelineConfig, RequestParams};
use logitsproc_rs::tables::thinking::ThinkingConfig;

const VOCAB: usize = 32_000;

/// A small deterministic generator (the bench must not depend on a crate's RNG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn params(rng: &mut Lcg) -> RequestParams<SharedHistory> {
    let mut p = RequestParams::neutral(Output::fed(Vec::new()));
    if rng.below(2) == 0 {
        p.set("min_p", Value::Float(0.1));
    }
    if rng.below(4) == 0 {
        let base = rng.below(VOCAB as u64 - 5) as i64;
        p.set(
            "logit_bias",
            Value::Bias((0..5).map(|k| (base + k, 1.0)).collect()),
        );
    }
    if rng.below(4) == 0 {
        p.set("min_tokens", Value::Int(16));
        p.set("stop_token_ids", Value::Ids(Some(vec![2, 3])));
    }
    if rng.below(3) == 0 {
        p.set("repetition_penalty", Value::Float(1.2));
        p.set("frequency_penalty", Value::Float(0.5));
        p.prompt = Some((0..32).map(|_| rng.below(VOCAB as u64) as i64).collect());
    }
    if rng.below(3) == 0 {
        p.set("bad_words", Value::IdLists(vec![vec![7], vec![8, 9]]));
    }
    if rng.below(4) == 0 {
        p.set("thinking_token_budget", Value::OptInt(Some(64)));
    }
    p
}

fn pipeline(b: usize) -> Pipeline<SharedHistory> {
    let mut cfg = PipelineConfig::new(b, VOCAB)
        .with_cap("max_logit_bias_entries", 64)
        .with_cap("max_stop_token_ids", 16)
        .with_cap("max_bad_words", 16)
        .with_cap("max_bad_word_len", 8)
        .with_cap("max_allowed_token_ids", 256);
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
        start_ids: vec![5],
        end_ids: vec![6],
    });
    cfg.host_kernels = true;
    Pipeline::new(cfg).expect("valid sizes")
}

fn bench_pipeline(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline_step_token_feed");
    for b in [64usize, 256, 1024] {
        let mut rng = Lcg(b as u64);
        let mut p = pipeline(b);
        let mut u = BatchUpdate::new(b);
        u.added = (0..b).map(|i| (i, params(&mut rng))).collect();
        p.step(Some(u), None).unwrap();
        let mut tokens = vec![0i64; b];
        g.bench_with_input(BenchmarkId::from_parameter(b), &b, |bench, &b| {
            bench.iter(|| {
                for t in tokens.iter_mut() {
                    *t = rng.below(VOCAB as u64) as i64;
                }
                let mut u = BatchUpdate::new(b);
                for slot in 0..b {
                    if rng.below(64) == 0 {
                        u.added.push((slot, params(&mut rng)));
                    }
                }
                let update = (!u.added.is_empty()).then_some(u);
                p.step(update, Some((&tokens, None))).unwrap();
                black_box(p.stage(0, false).unwrap());
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_pipeline);
criterion_main!(benches);
