//! The sampling tail without a sort (issues 27, 41): kept sets for top-k and top-p
//! ([`kept`]; a row only torch's arithmetic on its sorted values decides gets them from
//! [`sorted`]), vLLM 0.25.1's exponential race on torch's own random streams ([`race`],
//! [`mt19937`]), a batch-invariant Gumbel race on counter-based noise ([`noise`]), and the
//! fused passes that run every step of a row in one call: `batch_invariant`'s ([`fused`]) and
//! `exact`'s ([`exact`]). Pure Rust over slices; the bindings pass the tensors' memory in.

pub mod exact;
pub mod fast_math;
pub mod fused;
pub mod kept;
pub mod mt19937;
pub mod noise;
pub mod race;
pub mod sorted;

/// The threads a call may use: `LOGITSPROC_SAMPLING_THREADS` when set (read once; the
/// benchmarks set 1 to compare one core with one core), else the machine's cores.
pub fn threads_allowed() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("LOGITSPROC_SAMPLING_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// Runs `f(row, row_index, worker_scratch)` on every row of a `[rows, vocab]` view with
/// stride `row_stride` into `data`, split over the machine's cores when there is enough work
/// (`work` elements in all) to pay for the threads. Results in row order.
pub fn for_each_row_mut<S: Default, R: Send>(
    data: &mut [f32],
    rows: usize,
    vocab: usize,
    row_stride: usize,
    work: usize,
    f: impl Fn(&mut [f32], usize, &mut S) -> R + Sync,
) -> Vec<R> {
    const MIN_WORK_PER_THREAD: usize = 1 << 16;
    let cores = threads_allowed();
    let threads = cores.min(rows).min(work / MIN_WORK_PER_THREAD).max(1);
    let run = |data: &mut [f32], first: usize, count: usize| -> Vec<R> {
        let mut s = S::default();
        (0..count)
            .map(|j| {
                let at = j * row_stride;
                f(&mut data[at..at + vocab], first + j, &mut s)
            })
            .collect()
    };
    if threads <= 1 {
        return run(data, 0, rows);
    }
    let chunk = rows.div_ceil(threads);
    std::thread::scope(|scope| {
        let mut rest = data;
        let mut handles = Vec::new();
        let mut first = 0;
        while first < rows {
            let count = chunk.min(rows - first);
            let take = if first + count == rows {
                rest.len()
            } else {
                count * row_stride
            };
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(take);
            rest = tail;
            let run = &run;
            handles.push(scope.spawn(move || run(mine, first, count)));
            first += count;
        }
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a sampling worker panicked"))
            .collect()
    })
}
