"""CUDA: the processors on a GPU give the CPU's results, with pinned staging copies, non-blocking
uploads, no host-device sync in ``apply``, and safe asynchronous uploads.

Skipped where no CUDA device exists (``pytest -m cuda`` selects only these). The three vLLM
built-ins (``sampler_transforms=False``) must match the CPU bit for bit; the full pipeline
(penalties divide and multiply) is compared with a float32 tolerance and identical -inf masks.

On a device the pipeline's arena is one ``uint8`` tensor on the GPU; each step Rust copies what
changed into a host *staging* copy and ``DeviceArena`` uploads it with one non-blocking copy
(staging copy 0 for the step, copies 1 to 3 for uploads from ``apply``). With
``is_pin_memory`` every staging copy is registered with CUDA on first use and unregistered when
the pipeline dies.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    LogitsProcessors,
    MoveDirectionality,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs._arena import DeviceArena
from logitsproc_rs.pipeline import Pipeline
from logitsproc_rs.simulate import ChurnSimulator

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

V = 1000
CFG = EngineConfig(max_num_seqs=32, vocab_size=V, max_logit_bias_entries=8, max_stop_token_ids=8)


@pytest.fixture(autouse=True)
def _no_sync_debug_leak() -> Iterator[None]:
    yield
    torch.cuda.set_sync_debug_mode(0)


def build(device: str, pin: bool, full: bool) -> LogitsProcessors:
    return build_logitsprocs(CFG, device, pin, sampler_transforms=full)


def make_params(rng: random.Random) -> SamplingParams:
    bias = {rng.randrange(V): rng.choice([-5.0, -0.5, 0.25, 3.0]) for _ in range(rng.randint(0, 4))}
    return SamplingParams(
        temperature=rng.choice([0.0, 0.7, 1.0]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.2, 0.5]),
        logit_bias=bias or None,
        min_tokens=rng.choice([0, 0, 2, 5, 9]),
        max_tokens=64,
        stop_token_ids=[rng.randrange(V) for _ in range(rng.randint(0, 3))],
        eos_token_id=rng.choice([None, 0, 1]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.3, 0.8]),
        frequency_penalty=rng.choice([0.0, 0.0, 0.5, -0.3]),
        presence_penalty=rng.choice([0.0, 0.0, 0.4]),
        allowed_token_ids=rng.sample(range(V), 50) if rng.random() < 0.1 else None,
        bad_words_token_ids=[[rng.randrange(8)], [rng.randrange(8), rng.randrange(8)]]
        if rng.random() < 0.2
        else None,
    )


def apply_all(procs: LogitsProcessors, logits: torch.Tensor) -> torch.Tensor:
    """Every processor on every row: non-argmax-invariant first, then the invariant ones."""
    for p in procs.non_argmax_invariant:
        logits = p.apply(logits)
    for p in procs.argmax_invariant:
        logits = p.apply(logits)
    return logits


def assert_match(got: torch.Tensor, want: torch.Tensor, exact: bool, what: str = "") -> None:
    got = got.cpu()
    if exact:
        assert torch.equal(got, want), what
        return
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), what
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], rtol=1e-6, atol=1e-5), what


def pipeline_of(procs: LogitsProcessors) -> Pipeline:
    """The one pipeline every built-in of ``procs`` is a view on, with its device arena."""
    pipe = procs.pipeline
    assert isinstance(pipe, Pipeline)
    for p in procs.all:
        assert p.pipeline is pipe, type(p).__name__
    assert isinstance(pipe.arena, DeviceArena)
    return pipe


def used_staging(procs: LogitsProcessors) -> list[Any]:
    """``HostBufferView``s of the staging copies the arena has uploaded from so far (only
    those: ``core.staging(k)`` makes a copy that is not there yet)."""
    pipe = pipeline_of(procs)
    return [pipe.core.staging(k) for k in pipe.arena.staging_in_use]


def placeholder_step(procs: LogitsProcessors, n: int = 16) -> list[list[int]]:
    """Two steps of ``n`` requests with penalties and bad words; after the second every output
    ends in an async ``-1`` placeholder. Returns the outputs: the caller fills the
    placeholders in before ``apply``, which then looks again and uploads what changed from a
    staging copy other than 0."""
    outputs: list[list[int]] = [[5] for _ in range(n)]
    sp = SamplingParams(
        temperature=1.0,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        bad_words_token_ids=[[6, 7]],
    )
    update = BatchUpdate(n, [], [(i, sp, [1, 2, 3], outputs[i]) for i in range(n)], [])
    procs.update_state(update)
    for o in outputs:
        o.append(-1)
    procs.update_state(None)
    assert procs.pipeline.count("placeholders")
    return outputs


@pytest.mark.parametrize("full", [False, True], ids=["builtins", "full"])
@pytest.mark.parametrize("is_pin_memory", [True, False], ids=["pinned", "pageable"])
def test_cuda_matches_cpu_under_churn(is_pin_memory: bool, full: bool) -> None:
    cpu = build("cpu", False, full)
    gpu = build("cuda", is_pin_memory, full)
    sim = ChurnSimulator(
        CFG.max_num_seqs,
        V,
        seed=7,
        make_params=make_params,
        target_batch=24,
        finish_prob=0.08,
        swap_prob=0.1,
        max_tokens=(2, 20),
        next_token=lambda rng, req: rng.randrange(8) if rng.random() < 0.5 else rng.randrange(V),
    )
    g = torch.Generator().manual_seed(0)
    nonempty = 0
    for _ in range(60):
        update = sim.step()
        for p in cpu.all:
            p.update_state(update)
        for p in gpu.all:
            p.update_state(update)
        n = sim.batch.num_reqs
        if n == 0:
            continue
        nonempty += 1
        x = torch.randn(n, V, generator=g) * 4
        want = apply_all(cpu, x.clone())
        got = apply_all(gpu, x.to("cuda"))
        assert got.device.type == "cuda"
        assert_match(got, want, exact=not full, what=f"step {sim.steps}")
    assert nonempty > 40


def test_device_arena_on_the_gpu() -> None:
    gpu = build("cuda", True, full=True)
    pipe = pipeline_of(gpu)
    arena = pipe.arena
    assert not arena.zero_copy and not pipe.host_kernels
    assert arena.arena.device.type == "cuda" and arena.arena.dtype == torch.uint8
    assert arena.views and all(v.device.type == "cuda" for v in arena.views)
    # Every section view lies inside the device arena.
    lo, hi = arena.arena.data_ptr(), arena.arena.data_ptr() + arena.arena.numel()
    for v in arena.views:
        assert lo <= v.data_ptr() and v.data_ptr() + v.numel() * v.element_size() <= hi
    cells = pipe.device_state["penalties"].cells  # the penalties' count matrix
    assert cells is not None and cells.device.type == "cuda"


def test_staging_copies_pinned_after_registration() -> None:
    gpu = build("cuda", True, full=True)
    views = used_staging(gpu)
    assert len(views) == 1  # staging copy 0: the first, full upload
    for v in views:
        assert v.data_ptr % 4096 == 0 and v.nbytes % 4096 == 0
        assert torch.from_dlpack(v).is_pinned()
    # An upload from apply (async placeholder filled in) uses, and registers, another copy.
    outputs = placeholder_step(gpu)
    for o in outputs:
        o[-1] = 6
    apply_all(gpu, torch.randn(16, V, device="cuda"))
    torch.cuda.synchronize()
    views = used_staging(gpu)
    assert len(views) >= 2
    assert len({v.data_ptr for v in views}) == len(views)
    for v in views:
        assert torch.from_dlpack(v).is_pinned()

    # Without is_pin_memory nothing is registered.
    plain = build("cuda", False, full=True)
    outputs = placeholder_step(plain)
    for o in outputs:
        o[-1] = 6
    apply_all(plain, torch.randn(16, V, device="cuda"))
    torch.cuda.synchronize()
    views = used_staging(plain)
    assert len(views) >= 2
    for v in views:
        assert not torch.from_dlpack(v).is_pinned()


def test_staging_unregistered_when_processors_die() -> None:
    gpu = build("cuda", True, full=True)
    outputs = placeholder_step(gpu)
    for o in outputs:
        o[-1] = 6
    apply_all(gpu, torch.randn(16, V, device="cuda"))
    tensors = [torch.from_dlpack(v) for v in used_staging(gpu)]
    assert len(tensors) >= 2
    assert all(t.is_pinned() for t in tensors)
    del gpu
    gc.collect()
    torch.cuda.synchronize()
    # The memory is still alive (the tensors own it) but no longer registered.
    assert not any(t.is_pinned() for t in tensors)
    for t in tensors:
        t.zero_()


def _populate(procs: LogitsProcessors, n: int, outputs: list[list[int]]) -> None:
    added = [
        (
            i,
            SamplingParams(
                temperature=1.0,
                min_p=0.1 * (i % 4),
                logit_bias={(7 * i) % V: 2.0, (7 * i + 1) % V: -1.0} if i % 2 else None,
                min_tokens=3 if i % 3 else 0,
                stop_token_ids=[(11 * i) % V],
                eos_token_id=2,
                repetition_penalty=1.2 if i % 2 else 1.0,
                frequency_penalty=0.3 if i % 3 == 1 else 0.0,
                presence_penalty=0.2 if i % 4 == 1 else 0.0,
                allowed_token_ids=list(range(40)) if i == 5 else None,
                bad_words_token_ids=[[5], [7, 5]] if i % 5 == 0 else None,
            ),
            [1, 2, 3, i],
            outputs[i],
        )
        for i in range(n)
    ]
    update = BatchUpdate(batch_size=n, removed=[], added=added, moved=[])
    for p in procs.all:
        p.update_state(update)


def test_apply_makes_no_host_device_sync() -> None:
    gpu = build("cuda", True, full=True)
    outputs: list[list[int]] = [[] for _ in range(16)]
    _populate(gpu, 16, outputs)
    xs = [torch.randn(16, V, device="cuda") for _ in range(3)]
    x0 = [x.clone() for x in xs]
    torch.cuda.synchronize()
    for step, x in enumerate(xs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            for p in gpu.non_argmax_invariant:
                x = p.apply(x)
            for p in gpu.argmax_invariant:
                x = p.apply(x)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert not torch.equal(x, x0[step])  # the processors did work
        # The next step: outputs grow, a request is replaced (update_state may wait; apply not).
        for o in outputs:
            o.append(5)
        for p in gpu.all:
            p.update_state(None)
        if step == 0:
            sp = SamplingParams(temperature=1.0, min_p=0.3, logit_bias={3: 1.0}, min_tokens=4)
            update = BatchUpdate(batch_size=16, removed=[], added=[(4, sp, None, [])], moved=[])
            for p in gpu.all:
                p.update_state(update)
    torch.cuda.synchronize()


@pytest.mark.parametrize("full", [False, True], ids=["builtins", "full"])
def test_step_upload_is_non_blocking(full: bool) -> None:
    """With pinned staging copies, ``update_state`` queues its upload (and the penalty
    matrix's updates) behind the GPU's work and returns without waiting for the device; so
    does ``apply``; the logits then equal the CPU's."""
    n = 16
    cpu = build("cpu", False, full)
    gpu = build("cuda", True, full)
    outs_cpu: list[list[int]] = [[] for _ in range(n)]
    outs_gpu: list[list[int]] = [[] for _ in range(n)]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, V, generator=g) * 3
    # A first step (kernels loaded, staging copy 0 in use), checked against the CPU.
    _populate(cpu, n, outs_cpu)
    _populate(gpu, n, outs_gpu)
    assert_match(apply_all(gpu, x.to("cuda")), apply_all(cpu, x.clone()), not full, "warm-up")
    torch.cuda.synchronize()

    def update(outs: list[list[int]]) -> BatchUpdate:
        for o in outs:
            o.append(4)
        sp = SamplingParams(
            temperature=1.0,
            min_p=0.2,
            logit_bias={9: 3.0},
            min_tokens=5,
            stop_token_ids=[4],
            repetition_penalty=1.4,
            frequency_penalty=0.3,
        )
        swap = (0, 1, MoveDirectionality.SWAP)
        return BatchUpdate(n, [], [(3, sp, [1, 9], [4, 4])], [swap])

    cpu.update_state(update(outs_cpu))
    want = apply_all(cpu, x.clone())
    dx = x.to("cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(500_000_000)  # a few hundred ms of GPU work queued ahead
    gpu.update_state(update(outs_gpu))
    assert gpu.bytes_uploaded_last_step > 0
    got = apply_all(gpu, dx)
    busy = not stream.query()  # the host got here while the GPU was still sleeping
    torch.cuda.synchronize()
    assert busy, "update_state or apply waited for the device"
    assert_match(got, want, exact=not full, what="after the queued step")


def test_upload_from_apply_matches_cpu_without_sync() -> None:
    """Async placeholders filled in between ``update_state`` and ``apply``: ``apply`` looks
    again and uploads from another staging copy, with no host-device sync, and the logits
    equal the CPU's."""
    cpu = build("cpu", False, True)
    gpu = build("cuda", True, True)
    outs_cpu = placeholder_step(cpu)
    outs_gpu = placeholder_step(gpu)
    for o in (*outs_cpu, *outs_gpu):
        o[-1] = 6  # the placeholder becomes token 6: counted, and bad word [6, 7] bans 7
    x = torch.randn(16, V, generator=torch.Generator().manual_seed(6)) * 3
    want = apply_all(cpu, x.clone())
    assert torch.isneginf(want[:, 7]).all()
    dx = x.to("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = apply_all(gpu, dx)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(used_staging(gpu)) >= 2
    assert_match(got, want, exact=False, what="placeholder filled before apply")


@pytest.mark.parametrize("full", [False, True], ids=["builtins", "full"])
def test_update_while_copy_in_flight_is_correct(full: bool) -> None:
    """Queue GPU work ahead, so the non-blocking uploads of step A are still pending when step
    B's update rewrites the pinned host buffers: step A's apply must still see A's values."""
    n = 16
    cpu = build("cpu", False, full)
    gpu = build("cuda", True, full)

    def update_a(outs: list[list[int]]) -> BatchUpdate:
        sp = SamplingParams(
            temperature=1.0,
            min_p=0.5,
            logit_bias={1: 5.0, 2: 5.0},
            min_tokens=4,
            stop_token_ids=[3],
            repetition_penalty=1.5,
            presence_penalty=0.5,
            allowed_token_ids=list(range(0, V, 2)),
        )
        return BatchUpdate(n, [], [(i, sp, [1, 2, 3], outs[i]) for i in range(n)], [])

    def update_b() -> BatchUpdate:
        sp = SamplingParams(
            temperature=1.0,
            min_p=0.01,
            logit_bias={4: -5.0},
            min_tokens=4,
            stop_token_ids=[5, 6],
            frequency_penalty=-0.7,
            bad_words_token_ids=[[9]],
        )
        # Replace every request (new lists) and reorder.
        swap = (0, n - 1, MoveDirectionality.SWAP)
        return BatchUpdate(n, [], [(i, sp, [7, 8], [4]) for i in range(n)], [swap])

    g = torch.Generator().manual_seed(3)
    xa = torch.randn(n, V, generator=g)
    xb = torch.randn(n, V, generator=g)

    outs_cpu: list[list[int]] = [[] for _ in range(n)]
    for p in cpu.all:
        p.update_state(update_a(outs_cpu))
    want_a = apply_all(cpu, xa.clone())
    for p in cpu.all:
        p.update_state(update_b())
    want_b = apply_all(cpu, xb.clone())
    assert not torch.equal(want_a, apply_all(cpu, xa.clone()))  # A and B really differ

    # Inputs are on the device before the GPU is kept busy (a pageable H2D copy would wait).
    da, db = xa.to("cuda"), xb.to("cuda")
    torch.cuda.synchronize()
    for _ in range(3):
        outs_gpu: list[list[int]] = [[] for _ in range(n)]
        torch.cuda._sleep(100_000_000)  # ~50 ms of queued GPU work ahead of the uploads
        for p in gpu.all:
            p.update_state(update_a(outs_gpu))  # non-blocking uploads, queued behind the sleep
        got_a = apply_all(gpu, da.clone())
        for p in gpu.all:
            p.update_state(update_b())  # rewrites the pinned host buffers
        got_b = apply_all(gpu, db.clone())
        torch.cuda.synchronize()
        assert_match(got_a, want_a, exact=not full, what="step A")
        assert_match(got_b, want_b, exact=not full, what="step B")


# --- streams, devices, graphs, the whole sampler (issue 9) -----------------------------------

THINK_CFG = EngineConfig(
    max_num_seqs=32,
    vocab_size=V,
    max_logit_bias_entries=8,
    max_stop_token_ids=8,
    reasoning_start_token_ids=[7],
    reasoning_end_token_ids=[8, 9],
)


def _think_params(rng: random.Random) -> SamplingParams:
    sp = make_params(rng)
    object.__setattr__(sp, "thinking_token_budget", rng.choice([None, 0, 2, 5]))
    return sp


def _churn_pair(cfg: EngineConfig, device: str, steps: int, seed: int) -> Iterator[Any]:
    """The same churn on the CPU and on ``device``: yields (cpu procs, device procs, rows)."""
    cpu = build_logitsprocs(cfg, "cpu", False)
    dev = build_logitsprocs(cfg, device, True)
    sim = ChurnSimulator(cfg.max_num_seqs, V, seed, _think_params)
    for _ in range(steps):
        update = sim.step()
        cpu.update_state(update)
        dev.update_state(update)
        yield cpu, dev, len(sim.batch.rows())


def test_thinking_budget_on_cuda_matches_cpu() -> None:
    g = torch.Generator().manual_seed(3)
    for cpu, gpu, rows in _churn_pair(THINK_CFG, "cuda", 40, 11):
        x = torch.randn(rows, V, generator=g)
        want = apply_all(cpu, x.clone())
        assert_match(apply_all(gpu, x.cuda()), want, exact=False)


def test_apply_on_another_stream_waits_for_the_step_on_the_device() -> None:
    """update_state uploads on the default stream behind a long kernel; apply runs on a side
    stream whose logits are ready at once. Without the device-side wait the side stream would
    read the arena before the copy lands. No host wait happens in apply."""
    g = torch.Generator().manual_seed(4)
    side = torch.cuda.Stream()
    cpu = build_logitsprocs(CFG, "cpu", False)
    gpu = build_logitsprocs(CFG, "cuda", True)
    sim = ChurnSimulator(CFG.max_num_seqs, V, 5, _think_params)
    for step in range(12):
        update = sim.step()
        torch.cuda._sleep(50_000_000)  # the default stream is busy; the upload queues after it
        cpu.update_state(update)
        gpu.update_state(update)
        rows = len(sim.batch.rows())
        x = torch.randn(rows, V, generator=g)
        want = apply_all(cpu, x.clone())
        with torch.cuda.stream(side):
            xd = x.cuda()
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = apply_all(gpu, xd)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        side.synchronize()
        assert_match(got, want, exact=False, what=f"step {step}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_processors_on_cuda1_while_device0_is_current() -> None:
    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(6)
    for cpu, gpu, rows in _churn_pair(CFG, "cuda:1", 10, 7):
        assert torch.cuda.current_device() == 0
        x = torch.randn(rows, V, generator=g)
        want = apply_all(cpu, x.clone())
        assert_match(apply_all(gpu, x.to("cuda:1")), want, exact=False)
    assert gpu.pipeline.device == torch.device("cuda", 1)
    assert gpu.pipeline.arena.arena.device == torch.device("cuda", 1)


def test_cuda_device_without_index_is_the_current_one() -> None:
    procs = build_logitsprocs(CFG, "cuda", True)
    assert procs.pipeline.device == torch.device("cuda", torch.cuda.current_device())


def test_whole_sampler_many_steps_without_a_sync() -> None:
    """The Sampler and every processor (penalties, thinking, bad words, allowed ids) over many
    churn steps: no host-device sync in apply or sampling, and the tokens equal the CPU's for
    greedy rows (random rows draw from per-device generators)."""
    from logitsproc_rs import Sampler

    cpu = build_logitsprocs(THINK_CFG, "cpu", False)
    gpu = build_logitsprocs(THINK_CFG, "cuda", True)
    s_cpu, s_gpu = Sampler(cpu), Sampler(gpu)
    sim = ChurnSimulator(THINK_CFG.max_num_seqs, V, 9, _think_params)
    g = torch.Generator().manual_seed(9)
    for step in range(60):
        update = sim.step()
        cpu.update_state(update)
        gpu.update_state(update)
        rows = sim.batch.rows()
        if not rows:
            continue
        params = [r.params for r in rows]
        md_cpu = SamplingMetadata.from_params(params, V)
        md_gpu = SamplingMetadata.from_params(params, V, device="cuda")
        x = torch.randn(len(rows), V, generator=g)
        xd = x.cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = s_gpu(xd, md_gpu)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        want = s_cpu(x, md_cpu)
        greedy = torch.tensor([p.temperature == 0.0 for p in params])
        got = out.sampled_token_ids.cpu()
        assert torch.equal(got[greedy], want.sampled_token_ids[greedy]), f"step {step}"


def test_apply_of_a_steady_batch_can_be_captured_and_replayed() -> None:
    """A CUDA graph of every processor's apply, captured once, replays correctly on later steps
    with the same ``graph_key`` (outputs grow: penalty counts change in place on the device)."""
    n = 16
    cpu = build("cpu", False, full=True)
    gpu = build("cuda", True, full=True)
    outs_cpu: list[list[int]] = [[] for _ in range(n)]
    outs_gpu: list[list[int]] = [[] for _ in range(n)]
    _populate(cpu, n, outs_cpu)
    _populate(gpu, n, outs_gpu)

    def capture() -> tuple[Any, torch.Tensor, torch.Tensor, tuple[int, ...]]:
        # Warm up on a side stream (as torch.cuda.graphs asks), then capture.
        work = torch.zeros(n, V, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            apply_all(gpu, work.clone())
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = apply_all(gpu, work)
        return graph, work, out, gpu.pipeline.graph_key

    graph, work, static_out, key = capture()
    captures, replays = 1, 0
    g = torch.Generator().manual_seed(10)
    for step in range(12):
        for oc, og in zip(outs_cpu, outs_gpu, strict=True):
            t = random.Random(step).randrange(20, V)
            oc.append(t)
            og.append(t)
        cpu.update_state(None)
        gpu.update_state(None)
        if gpu.pipeline.graph_key != key:  # e.g. min_tokens reached: recapture
            graph, work, static_out, key = capture()
            captures += 1
        x = torch.randn(n, V, generator=g)
        work.copy_(x.cuda())
        graph.replay()
        replays += 1
        torch.cuda.synchronize()
        assert_match(static_out, apply_all(cpu, x.clone()), exact=False, what=f"step {step}")
    assert captures < replays  # most steps replayed a graph captured on an earlier step


@pytest.mark.parametrize("seed", range(3))
def test_spec_decode_draft_rows_on_cuda_match_cpu(seed: int) -> None:
    """MinTokens and bad words over draft rows (vLLM's rejection-sampler path) on the GPU."""
    spec_cfg = EngineConfig(
        max_num_seqs=6, vocab_size=V, num_speculative_tokens=3, draft_rows="vllm"
    )
    rng = random.Random(seed)
    sides = {}
    for dev in ("cpu", "cuda"):
        procs = build_logitsprocs(spec_cfg, dev, dev == "cuda")
        sides[dev] = {type(p).__name__: p for p in procs.all}
    batch = 6
    outputs = {dev: [[rng.randrange(4)] for _ in range(batch)] for dev in sides}
    added_params = [
        SamplingParams(
            max_tokens=None,
            min_tokens=rng.choice((0, 2, 5, 8)),
            stop_token_ids=rng.sample(range(10, 14), 2),
            eos_token_id=15,
            bad_words_token_ids=[[rng.randrange(4) for _ in range(rng.randint(1, 3))]],
        )
        for _ in range(batch)
    ]
    for dev, by_name in sides.items():
        update = BatchUpdate(
            batch, [], [(r, added_params[r], None, outputs[dev][r]) for r in range(batch)], []
        )
        for p in by_name.values():
            p.update_state(update)
    for _ in range(4):
        num_draft = [rng.randint(0, 3) for _ in range(batch)]
        drafts = [[rng.randrange(4) for _ in range(n)] for n in num_draft]
        x = torch.randn(sum(num_draft), V, generator=torch.Generator().manual_seed(seed))
        got = {}
        for dev, by_name in sides.items():
            mt, bw = by_name["MinTokensLogitsProcessor"], by_name["BadWordsLogitsProcessor"]
            y = mt.apply_with_spec_decode(x.clone().to(dev), num_draft)
            got[dev] = bw.apply_with_spec_decode(y, num_draft, drafts)
        assert torch.equal(got["cuda"].cpu(), got["cpu"])
        t = rng.randrange(4)
        for dev, by_name in sides.items():
            for o in outputs[dev]:
                o.append(t)
            for p in by_name.values():
                p.update_state(None)


@pytest.mark.parametrize("seed", range(2))
def test_draft_rows_per_position_on_cuda_match_the_reference(seed: int) -> None:
    """Draft rows per position on the GPU (the stable slots' and V1's draft layouts, every
    processor, penalties through the device count matrix and Triton): the CPU test's churn
    and reference (tests/test_draft_rows.py), on CUDA logits."""
    import test_draft_rows as drafts

    c = drafts.Churn(seed, slots=4, vocab=24, device="cuda")
    for _ in range(30):
        c.step(drafts=True)
    drafts.v1_churn(seed, device="cuda")


def test_triton_sampling_tail_on_cuda_matches_the_reference() -> None:
    """The sort-free sampling tail compiled (``kernels/_triton_sampling.py``) at B in {1, 32,
    256} and V in {32,000, 151,936}, on the rows and references of
    ``tests/test_triton_sampling.py`` (which runs them in Triton's interpreter): kept sets as
    the kernel's semantics written in torch (a boundary within float ``exp`` rounding aside),
    against vLLM's sort path only the documented kinds of difference, tokens as ``argmax(x +
    g)`` over the same kept set with the spec noise, the mask-only entry the same logits; the
    noise bits the spec's; one request's token the same in batches of 1, 3 and 7."""
    pytest.importorskip("triton")
    import test_triton_sampling as tts

    g = torch.Generator().manual_seed(31)
    totals: dict[str, int] = {}
    for vocab in (32_000, 151_936):
        for rows in (1, 32, 256):
            x, k, p = tts.make_rows(g, rows, vocab)
            seeds = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=g)
            positions = torch.randint(0, 1 << 20, (rows,), generator=g)
            dev = [t.cuda() for t in (x, k, p, seeds, positions)]
            counts = tts.compare_batch(*dev, tol=5e-5, mask_only=True)  # raises on a mismatch
            for key, n in counts.items():
                totals[key] = totals.get(key, 0) + n
    print(totals)
    assert totals["rows"] == 2 * 289 and totals["other"] == 0
    assert totals["vs_reference_rounding"] <= 4 and totals["near_tie_tokens"] <= 2, totals
    assert totals["same"] >= 0.7 * totals["rows"], totals
    tts.check_noise("cuda")
    tts.check_batch_invariance("cuda")


def test_sampler_modes_on_cuda() -> None:
    """``Sampler(sampling=...)`` on CUDA logits: ``exact`` is vLLM's torch path there (the same
    tokens as ``sort`` from the same CUDA generator state); ``batch_invariant`` runs the Triton
    kernel and gives a row the same token alone and inside a batch."""
    from logitsproc_rs import LogitsProcessors, Sampler, SamplingMetadata, SamplingParams

    dev = torch.device("cuda")
    vocab = 32_000
    params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9) for _ in range(8)]
    x = torch.randn(8, vocab, device=dev) * 4
    md = SamplingMetadata.from_params(params, vocab, dev)
    outs = []
    for mode in ("sort", "exact"):
        torch.cuda.manual_seed(3)
        outs.append(Sampler(LogitsProcessors([]), sampling=mode)(x.clone(), md))
    assert torch.equal(outs[0].sampled_token_ids, outs[1].sampled_token_ids)
    assert torch.equal(outs[0].logits, outs[1].logits)
    bi = Sampler(LogitsProcessors([]), sampling="batch_invariant")
    keys = list(range(8))
    batch = bi(x.clone(), SamplingMetadata.from_params(params, vocab, dev, None, keys, keys))
    alone = bi(
        x[5:6].clone(), SamplingMetadata.from_params(params[5:6], vocab, dev, None, [5], [5])
    )
    assert int(batch.sampled_token_ids[5]) == int(alone.sampled_token_ids[0])
