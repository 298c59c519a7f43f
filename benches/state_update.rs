//! Per-step state-update cost of the built-in trio under realistic churn.
//!
//! For each B in {64, 256, 1024} (capacity = B = max_num_seqs) a deterministic engine
//! simulation mirrors vLLM 0.25.1's `InputBatch`: ~1/64 of the live requests finish per step
//! (a fifth of the steps are quiet: `None` updates; the others carry the finishes),
//! new requests take the lowest freed slot (else the end of the batch), `condense` moves
//! UNIDIRECTIONAL from the tail into the remaining holes, the reorder step sometimes SWAPs, and
//! `get_and_reset` yields `None` when nothing changed. The batch hovers around 90% of B, so steps
//! both grow it (appends) and shrink it (condense). Requests draw their parameters independently:
//! 30% min_p, 30% logit_bias (8-12 entries), 30% min_tokens (1-48, with 2-4 stop ids); vocab
//! 32,000. The batch is filled (untimed) before the measured `STEPS` steps.
//!
//! One iteration = the whole `STEPS`-step sequence (`Throughput::Elements(STEPS)`), so
//! per-step cost = 1 / throughput.
//! * `min_p/B=..`, `logit_bias/B=..`: `iter_batched` with a fresh state and cloned, pre-built
//!   updates per iteration; generation and cloning are not timed. `None` steps cost nothing
//!   there (vLLM returns at once), so they are not called.
//! * `min_tokens/B=..`, `trio/B=..`: outputs must grow between steps (one token per live
//!   request with min_tokens, pushed into its `SharedHistory`). The pushes are kept out of the
//!   timed part with `iter_custom` and an `Instant` pair around each step's update calls
//!   (`update`, or `update_none` on `None` steps); `timer_overhead` measures that pair alone,
//!   so it can be subtracted. `trio` runs MinP, MinTokens, LogitBias in vLLM's order.

use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use logitsproc_rs::batch::{BatchUpdate, BatchUpdateBuilder, Move};
use logitsproc_rs::history::{SharedHistory, TokenHistory};
use logitsproc_rs::tables::logit_bias::LogitBiasState;
use logitsproc_rs::tables::min_p::MinPState;
use logitsproc_rs::tables::min_tokens::{MinTokensParams, MinTokensState};

const SIZES: [usize; 3] = [64, 256, 1024];
const STEPS: usize = 2000;
const VOCAB: usize = 32_000;
const MAX_BIAS: usize = 16;
const MAX_STOP: usize = 4;
/// Share of steps where nothing happens (the update is `None`).
const QUIET: f64 = 0.2;

/// SplitMix64: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

struct Request {
    min_p: f64,
    bias: Vec<(i64, f64)>,
    min_tokens: i64,
    stop: Vec<i64>,
}

impl Request {
    fn random(rng: &mut Rng) -> Self {
        let min_p = if rng.chance(0.3) {
            0.02 + 0.2 * rng.unit()
        } else {
            0.0
        };
        let mut bias = Vec::new();
        if rng.chance(0.3) {
            let n = 8 + rng.below(5);
            while bias.len() < n {
                let t = rng.below(VOCAB) as i64;
                if bias.iter().all(|&(u, _)| u != t) {
                    bias.push((t, 10.0 * rng.unit() - 5.0));
                }
            }
        }
        let (min_tokens, stop) = if rng.chance(0.3) {
            let n = 2 + rng.below(3);
            let stop = (0..n).map(|_| rng.below(VOCAB) as i64).collect();
            (1 + rng.below(48) as i64, stop)
        } else {
            (0, Vec::new())
        };
        Request {
            min_p,
            bias,
            min_tokens,
            stop,
        }
    }
}

/// One B's pre-generated engine run: updates carry request ids.
struct Workload {
    b: usize,
    requests: Vec<Request>,
    /// Fills the batch; applied untimed before the measured steps.
    warmup: BatchUpdate<usize>,
    steps: Vec<Option<BatchUpdate<usize>>>,
    /// Request ids with min_tokens > 0 live after the warm-up and after each step (their
    /// outputs grow by one token before the next step).
    growing: Vec<Vec<usize>>,
}

/// vLLM's InputBatch slot bookkeeping, driven by a random arrival/finish process.
struct Engine {
    cap: usize,
    slots: Vec<Option<usize>>,
    num_reqs: usize,
    builder: BatchUpdateBuilder<usize>,
}

impl Engine {
    fn add(&mut self, id: usize) {
        let idx = self.builder.pop_removed().unwrap_or(self.num_reqs);
        debug_assert!(idx < self.cap && self.slots[idx].is_none());
        self.slots[idx] = Some(id);
        self.builder.added.push((idx, id));
        self.num_reqs += 1;
    }

    fn condense(&mut self) {
        if self.builder.removed().is_empty() || self.num_reqs == 0 {
            return;
        }
        let mut last = self.num_reqs + self.builder.removed().len() - 1;
        loop {
            while self.builder.removed().contains(&last) {
                last -= 1;
            }
            match self.builder.peek_removed() {
                Some(e) if e < last => {
                    self.builder.pop_removed();
                    self.slots[e] = self.slots[last].take();
                    self.builder.moved.push(Move::unidirectional(last, e));
                    last -= 1;
                }
                _ => break,
            }
        }
    }
}

impl Workload {
    fn generate(b: usize, seed: u64) -> Self {
        let mut rng = Rng(seed);
        let mut requests = Vec::new();
        let mut engine = Engine {
            cap: b,
            slots: vec![None; b],
            num_reqs: 0,
            builder: BatchUpdateBuilder::new(),
        };
        let target = b * 9 / 10;
        for _ in 0..target {
            requests.push(Request::random(&mut rng));
            engine.add(requests.len() - 1);
        }
        let warmup = engine.builder.get_and_reset(engine.num_reqs).unwrap();
        let growing = |engine: &Engine, requests: &[Request]| -> Vec<usize> {
            engine
                .slots
                .iter()
                .flatten()
                .copied()
                .filter(|&id| requests[id].min_tokens > 0)
                .collect()
        };
        let mut grow = vec![growing(&engine, &requests)];
        let mut steps = Vec::with_capacity(STEPS);
        for _ in 0..STEPS {
            // A fifth of the steps are quiet (no request finishes or arrives, no reorder), so
            // `None` updates occur at every B.
            if rng.chance(QUIET) {
                steps.push(engine.builder.get_and_reset(engine.num_reqs));
                grow.push(growing(&engine, &requests));
                continue;
            }
            // Finished requests: 1/64 of the live ones per step on average.
            for i in 0..engine.num_reqs {
                if rng.chance(1.0 / 64.0 / (1.0 - QUIET)) {
                    engine.builder.removed_append(i).unwrap();
                    engine.slots[i] = None;
                }
            }
            engine.num_reqs = engine.slots.iter().flatten().count();
            // Arrivals: mean = expected finishes, pulled back towards 90% of B.
            let live = engine.num_reqs as f64;
            let mean = (live / 64.0 / (1.0 - QUIET) + (target as f64 - live) / 16.0).max(0.0);
            let trials = 2 * (b / 64) + 4;
            let arrivals = (0..trials)
                .filter(|_| rng.chance(mean / trials as f64))
                .count();
            for _ in 0..arrivals.min(b - engine.num_reqs) {
                requests.push(Request::random(&mut rng));
                engine.add(requests.len() - 1);
            }
            engine.condense();
            // Reorder: a few swaps on a quarter of the steps.
            if engine.num_reqs >= 2 && rng.chance(0.25) {
                for _ in 0..1 + rng.below(2) {
                    let (i, j) = (rng.below(engine.num_reqs), rng.below(engine.num_reqs));
                    if i != j {
                        engine.slots.swap(i, j);
                        engine.builder.moved.push(Move::swap(i, j));
                    }
                }
            }
            steps.push(engine.builder.get_and_reset(engine.num_reqs));
            grow.push(growing(&engine, &requests));
        }
        Workload {
            b,
            requests,
            warmup,
            steps,
            growing: grow,
        }
    }

    fn describe(&self) -> String {
        let some: Vec<&BatchUpdate<usize>> = self.steps.iter().flatten().collect();
        let count =
            |f: &dyn Fn(&BatchUpdate<usize>) -> usize| some.iter().map(|u| f(u)).sum::<usize>();
        let uni = count(&|u| {
            u.moved
                .iter()
                .filter(|m| m.dir == logitsproc_rs::MoveDirectionality::Unidirectional)
                .count()
        });
        let swap = count(&|u| u.moved.len()) - uni;
        let mean_bs = some.iter().map(|u| u.batch_size).sum::<usize>() as f64 / some.len() as f64;
        format!(
            "B={}: {} steps ({} None), added {}, removed {}, UNI {}, SWAP {}, mean batch_size {:.0}",
            self.b,
            self.steps.len(),
            self.steps.len() - some.len(),
            count(&|u| u.added.len()),
            count(&|u| u.removed.len()),
            uni,
            swap,
            mean_bs
        )
    }

    fn project<T>(
        &self,
        u: &BatchUpdate<usize>,
        f: impl Fn(usize, &Request) -> T,
    ) -> BatchUpdate<T> {
        BatchUpdate {
            batch_size: u.batch_size,
            removed: u.removed.clone(),
            added: u
                .added
                .iter()
                .map(|&(i, id)| (i, f(id, &self.requests[id])))
                .collect(),
            moved: u.moved.clone(),
        }
    }

    fn min_p_updates(&self) -> (BatchUpdate<f64>, Vec<Option<BatchUpdate<f64>>>) {
        let f = |_: usize, r: &Request| r.min_p;
        let steps = self
            .steps
            .iter()
            .map(|s| s.as_ref().map(|u| self.project(u, f)))
            .collect();
        (self.project(&self.warmup, f), steps)
    }

    fn bias_updates(&self) -> BiasUpdates {
        let f = |_: usize, r: &Request| r.bias.clone();
        let steps = self
            .steps
            .iter()
            .map(|s| s.as_ref().map(|u| self.project(u, f)))
            .collect();
        (self.project(&self.warmup, f), steps)
    }

    /// Fresh output lists for every request, and the updates that reference them.
    fn min_tokens_updates(&self, outputs: &[SharedHistory]) -> MinTokensUpdates {
        let f = |id: usize, r: &Request| MinTokensParams {
            min_tokens: r.min_tokens,
            stop_token_ids: r.stop.clone(),
            output: outputs[id].clone(),
            output_len: outputs[id].len(&()),
        };
        let steps = self
            .steps
            .iter()
            .map(|s| s.as_ref().map(|u| self.project(u, f)))
            .collect();
        (self.project(&self.warmup, f), steps)
    }

    fn fresh_outputs(&self) -> Vec<SharedHistory> {
        (0..self.requests.len())
            .map(|_| Arc::new(RwLock::new(Vec::with_capacity(64))))
            .collect()
    }

    fn grow(&self, outputs: &[SharedHistory], after: usize) {
        for &id in &self.growing[after] {
            outputs[id].write().unwrap().push(1);
        }
    }
}

type BiasUpdate = BatchUpdate<Vec<(i64, f64)>>;
type BiasUpdates = (BiasUpdate, Vec<Option<BiasUpdate>>);
type MinTokensUpdate = BatchUpdate<MinTokensParams<SharedHistory>>;
type MinTokensUpdates = (MinTokensUpdate, Vec<Option<MinTokensUpdate>>);

/// Everything one timed pass over the sequence needs, built untimed.
struct TrioRun {
    outputs: Vec<SharedHistory>,
    min_p: MinPState,
    bias: LogitBiasState,
    mt: MinTokensState<SharedHistory>,
    min_p_steps: Vec<Option<BatchUpdate<f64>>>,
    bias_steps: Vec<Option<BiasUpdate>>,
    mt_steps: Vec<Option<MinTokensUpdate>>,
}

impl TrioRun {
    fn new(w: &Workload) -> Self {
        let outputs = w.fresh_outputs();
        let (mp0, min_p_steps) = w.min_p_updates();
        let (lb0, bias_steps) = w.bias_updates();
        let (mt0, mt_steps) = w.min_tokens_updates(&outputs);
        let mut min_p = MinPState::new(w.b);
        let mut bias = LogitBiasState::new(w.b, VOCAB, MAX_BIAS);
        let mut mt = MinTokensState::new(w.b, VOCAB, MAX_STOP);
        min_p.update(mp0).unwrap();
        bias.update(lb0).unwrap();
        mt.update(mt0, &()).unwrap();
        w.grow(&outputs, 0);
        TrioRun {
            outputs,
            min_p,
            bias,
            mt,
            min_p_steps,
            bias_steps,
            mt_steps,
        }
    }
}

fn bench_min_p(c: &mut Criterion, workloads: &[Workload]) {
    let mut g = c.benchmark_group("min_p");
    configure(&mut g);
    for w in workloads {
        g.bench_function(BenchmarkId::from_parameter(format!("B={}", w.b)), |bench| {
            let (warm, steps) = w.min_p_updates();
            bench.iter_batched(
                || {
                    let mut s = MinPState::new(w.b);
                    s.update(warm.clone()).unwrap();
                    (s, steps.clone())
                },
                |(mut s, steps)| {
                    for u in steps.into_iter().flatten() {
                        black_box(s.update(u).unwrap());
                    }
                    s
                },
                BatchSize::PerIteration,
            );
        });
    }
    g.finish();
}

fn bench_logit_bias(c: &mut Criterion, workloads: &[Workload]) {
    let mut g = c.benchmark_group("logit_bias");
    configure(&mut g);
    for w in workloads {
        g.bench_function(BenchmarkId::from_parameter(format!("B={}", w.b)), |bench| {
            let (warm, steps) = w.bias_updates();
            bench.iter_batched(
                || {
                    let mut s = LogitBiasState::new(w.b, VOCAB, MAX_BIAS);
                    s.update(warm.clone()).unwrap();
                    (s, steps.clone())
                },
                |(mut s, steps)| {
                    for u in steps.into_iter().flatten() {
                        black_box(s.update(u).unwrap());
                    }
                    s
                },
                BatchSize::PerIteration,
            );
        });
    }
    g.finish();
}

/// Runs `iters` passes over the sequence, timing only `step` (not the output pushes).
fn timed_passes(w: &Workload, iters: u64, mut step: impl FnMut(&mut TrioRun, usize)) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let mut run = TrioRun::new(w);
        for k in 0..STEPS {
            let t = Instant::now();
            step(&mut run, k);
            total += t.elapsed();
            w.grow(&run.outputs, k + 1);
        }
        black_box(&run.mt);
    }
    total
}

fn bench_min_tokens(c: &mut Criterion, workloads: &[Workload]) {
    let mut g = c.benchmark_group("min_tokens");
    configure(&mut g);
    for w in workloads {
        g.bench_function(BenchmarkId::from_parameter(format!("B={}", w.b)), |bench| {
            bench.iter_custom(|iters| {
                timed_passes(w, iters, |run, k| {
                    black_box(match run.mt_steps[k].take() {
                        Some(u) => run.mt.update(u, &()).unwrap(),
                        None => run.mt.update_none(&()),
                    });
                })
            });
        });
    }
    g.finish();
}

fn bench_trio(c: &mut Criterion, workloads: &[Workload]) {
    let mut g = c.benchmark_group("trio");
    configure(&mut g);
    for w in workloads {
        g.bench_function(BenchmarkId::from_parameter(format!("B={}", w.b)), |bench| {
            bench.iter_custom(|iters| {
                timed_passes(w, iters, |run, k| {
                    if let Some(u) = run.min_p_steps[k].take() {
                        black_box(run.min_p.update(u).unwrap());
                    }
                    black_box(match run.mt_steps[k].take() {
                        Some(u) => run.mt.update(u, &()).unwrap(),
                        None => run.mt.update_none(&()),
                    });
                    if let Some(u) = run.bias_steps[k].take() {
                        black_box(run.bias.update(u).unwrap());
                    }
                })
            });
        });
    }
    g.finish();
}

/// One update that fills an empty batch to ~90% of B (server start, or a burst of arrivals):
/// the trio's cost for a single large step (`Throughput::Elements(1)`).
fn bench_fill_burst(c: &mut Criterion, workloads: &[Workload]) {
    let mut g = c.benchmark_group("fill_burst");
    configure(&mut g);
    g.throughput(Throughput::Elements(1));
    for w in workloads {
        g.bench_function(BenchmarkId::from_parameter(format!("B={}", w.b)), |bench| {
            bench.iter_batched(
                || {
                    let outputs = w.fresh_outputs();
                    let states = (
                        MinPState::new(w.b),
                        MinTokensState::new(w.b, VOCAB, MAX_STOP),
                        LogitBiasState::new(w.b, VOCAB, MAX_BIAS),
                    );
                    let updates = (
                        w.min_p_updates().0,
                        w.min_tokens_updates(&outputs).0,
                        w.bias_updates().0,
                    );
                    (states, updates, outputs)
                },
                |((mut s1, mut s2, mut s3), (mp, mt, lb), outputs)| {
                    black_box(s1.update(mp).unwrap());
                    black_box(s2.update(mt, &()).unwrap());
                    black_box(s3.update(lb).unwrap());
                    ((s1, s2, s3), outputs)
                },
                BatchSize::PerIteration,
            );
        });
    }
    g.finish();
}

/// The cost of the `Instant` pair that `min_tokens` and `trio` put around each step.
fn bench_timer_overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("timer_overhead");
    configure(&mut g);
    g.bench_function("per_step_instant_pair", |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                for k in 0..STEPS {
                    let t = Instant::now();
                    black_box(k);
                    total += t.elapsed();
                }
            }
            total
        });
    });
    g.finish();
}

fn configure(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    g.throughput(Throughput::Elements(STEPS as u64))
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
}

fn benches(c: &mut Criterion) {
    let workloads: Vec<Workload> = SIZES
        .iter()
        .map(|&b| Workload::generate(b, 0x5EED ^ b as u64))
        .collect();
    for w in &workloads {
        eprintln!("workload {}", w.describe());
    }
    bench_min_p(c, &workloads);
    bench_logit_bias(c, &workloads);
    bench_min_tokens(c, &workloads);
    bench_trio(c, &workloads);
    bench_fill_burst(c, &workloads);
    bench_timer_overhead(c);
}

criterion_group!(state_update, benches);
criterion_main!(state_update);
