"""Failure classes closed along the way (a part of issue 8): each gives a clear ValueError (or
MemoryError), never an abort, a panic or a silently wrong result."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    MinPLogitsProcessor,
    MoveDirectionality,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.reference import RefMinPLogitsProcessor

SRC = Path(__file__).resolve().parents[2] / "python"


def test_repetition_penalty_is_checked_as_float32() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    for rep in (1e39, 1e-46):
        sp = SamplingParams()
        object.__setattr__(sp, "repetition_penalty", rep)
        with pytest.raises(ValueError, match="request at index 0: field 'repetition_penalty'"):
            procs.update_state(BatchUpdate(1, [], [(0, sp, [1], [])], []))


def test_min_p_leaves_a_row_holding_plus_inf_alone_like_vllm() -> None:
    cfg = EngineConfig(max_num_seqs=2, vocab_size=6)
    ours_host = MinPLogitsProcessor(cfg, "cpu", False)
    ours_torch = build_logitsprocs(cfg, "cpu", False, emulate_device=True)
    ref = RefMinPLogitsProcessor(cfg, "cpu", False)
    u = BatchUpdate(2, [], [(i, SamplingParams(min_p=0.5), None, []) for i in range(2)], [])
    ours_host.update_state(u)
    ours_torch.update_state(u)
    ref.update_state(u)
    x = torch.tensor([[0.0, float("inf"), 1.0, -3.0, 2.0, 0.5], [0.0, 5.0, 1.0, -3.0, 2.0, 0.5]])
    want = ref.apply(x.clone())
    assert torch.equal(want[0], x[0])
    assert torch.equal(ours_host.apply(x.clone()), want)
    minp = next(p for p in ours_torch.argmax_invariant if isinstance(p, MinPLogitsProcessor))
    assert torch.equal(minp.apply(x.clone()), want)


def test_bools_are_not_indices_counts_or_token_ids() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=4, vocab_size=8), "cpu", False)
    with pytest.raises(ValueError, match="got a bool"):
        procs.update_state(BatchUpdate(2, [], [(True, SamplingParams(), None, [])], []))
    with pytest.raises(ValueError, match="got a bool"):
        procs.update_state(BatchUpdate(2, [], [], [(0, True, MoveDirectionality.SWAP)]))
    sp = SamplingParams(min_tokens=1)
    object.__setattr__(sp, "min_tokens", True)
    with pytest.raises(ValueError, match="field 'min_tokens'"):
        procs.update_state(BatchUpdate(1, [], [(0, sp, None, [])], []))
    sp = SamplingParams()
    object.__setattr__(sp, "allowed_token_ids", [True])
    with pytest.raises(ValueError, match="field 'allowed_token_ids'"):
        procs.update_state(BatchUpdate(1, [], [(0, sp, None, [])], []))


def test_endless_iterables_are_refused_at_their_cap() -> None:
    import itertools

    cfg = EngineConfig(max_num_seqs=2, vocab_size=8, max_bad_word_len=4, max_allowed_token_ids=4)
    procs = build_logitsprocs(cfg, "cpu", False)
    for field, value in (
        ("bad_words_token_ids", [itertools.repeat(1)]),
        ("allowed_token_ids", itertools.repeat(1)),
        ("_all_stop_token_ids", itertools.repeat(1)),
    ):
        sp = SamplingParams(min_tokens=3)
        object.__setattr__(sp, field, value)
        with pytest.raises(ValueError, match="cap"):
            procs.update_state(BatchUpdate(1, [], [(0, sp, None, [])], []))


def test_non_float_logits_are_refused() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    procs.update_state(BatchUpdate(1, [], [(0, SamplingParams(logit_bias={1: 1.0}), None, [])], []))
    for dtype in (torch.int64, torch.bool, torch.complex64):
        with pytest.raises(ValueError, match="floating-point"):
            for p in procs.non_argmax_invariant:
                p.apply(torch.zeros(1, 8, dtype=dtype))


def test_get_min_p_by_index_out_of_range_is_both_index_and_value_error() -> None:
    p = MinPLogitsProcessor(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    for bad in (-1, 2, True, "0"):
        with pytest.raises(IndexError):
            p.get_min_p_by_index(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            p.get_min_p_by_index(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_num_seqs", -1), ("max_num_seqs", 0), ("vocab_size", -5), ("max_num_seqs", None)],
)
def test_a_bad_duck_typed_config_names_the_config_field(field: str, value: object) -> None:
    sizes = {"max_num_seqs": 4, "vocab_size": 8, field: value}
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=sizes["max_num_seqs"]),
        model_config=SimpleNamespace(get_vocab_size=lambda: sizes["vocab_size"]),
    )
    with pytest.raises(ValueError, match=f"config field '{field}'"):
        MinPLogitsProcessor(cfg, "cpu", False)


def test_an_allocation_that_fails_is_a_memory_error_in_a_subprocess() -> None:
    """Sizes that pass the range checks but cannot be allocated (a huge per-request cap)."""
    script = textwrap.dedent(
        """
        import glob, importlib.util, os, resource, sys
        path = glob.glob(os.path.join(sys.argv[1], "logitsproc_rs", "_core*.so"))[0]
        spec = importlib.util.spec_from_file_location("logitsproc_rs._core", path)
        _core = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_core)
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        try:
            _core.Pipeline(2**20, 50, tables=['allowed'], caps=[('max_allowed_token_ids', 255)])
        except MemoryError as e:
            print("raised", type(e).__name__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(SRC)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("raised MemoryError"), out.stdout + out.stderr[-2000:]


def test_cpu_penalties_multiply_by_the_reciprocal_like_vllm_torch_fallback() -> None:
    """vLLM's CPU path (``_custom_ops.py`` torch fallback) scales positive logits by
    ``1.0 / rep``; its CUDA kernel divides. On the CPU ours must match the fallback exactly,
    including where the two forms differ by an ulp."""
    V = 4096
    cfg = EngineConfig(max_num_seqs=1, vocab_size=V)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, V, generator=g) * 20 - 5
    rep = torch.tensor([[1.3]], dtype=torch.float32)
    pen = torch.ones(1, V)  # every token in the prompt: the repetition penalty applies to all
    fallback = x * torch.where(x > 0, 1.0 / (pen * rep), pen * rep)
    assert not torch.equal(fallback, torch.where(x > 0, x / rep, x * rep))  # forms differ here
    for emulate in (False, True):
        procs = build_logitsprocs(cfg, "cpu", False, emulate_device=emulate)
        sp = SamplingParams(repetition_penalty=1.3)
        procs.update_state(BatchUpdate(1, [], [(0, sp, list(range(V)), [])], []))
        got = x.clone()
        for p in procs.non_argmax_invariant:
            got = p.apply(got)
        assert torch.equal(got, fallback), f"emulate_device={emulate}"


def test_float64_logits_are_penalised_without_a_float32_round_trip() -> None:
    V = 512
    cfg = EngineConfig(max_num_seqs=1, vocab_size=V)
    procs = build_logitsprocs(cfg, "cpu", False)
    sp = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.25)
    out = [3, 3, 7]
    procs.update_state(BatchUpdate(1, [], [(0, sp, [5], out)], []))
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(1, V, generator=g, dtype=torch.float64) * 20 - 5) + 1e-12  # not float32
    mask = torch.zeros(1, V, dtype=torch.bool)
    mask[0, [3, 5, 7]] = True
    counts = torch.zeros(1, V, dtype=torch.int64)
    counts[0, 3], counts[0, 7] = 2, 1
    pen = torch.where(mask, torch.tensor(1.3, dtype=torch.float32), torch.tensor(1.0))
    want = x * torch.where(x > 0, 1.0 / pen, pen)  # float32 scaling, float64 product (vLLM)
    want -= torch.tensor([[0.25]], dtype=torch.float32) * counts
    got = x.clone()
    for p in procs.non_argmax_invariant:
        got = p.apply(got)
    assert got.dtype == torch.float64
    assert torch.equal(got, want)


def test_every_processor_refuses_non_float_logits_even_with_nothing_to_do() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    procs.update_state(BatchUpdate(1, [], [(0, SamplingParams(), None, [])], []))
    for p in procs.all:
        with pytest.raises(ValueError, match="floating-point"):
            p.apply(torch.zeros(1, 8, dtype=torch.int32))


@pytest.mark.parametrize("junk", ["7", None, 2.5, True, -3, 2**70])
def test_junk_in_an_output_list_is_an_error_not_a_placeholder(junk: object) -> None:
    """Only ints >= -1 (-1: an async placeholder) belong in an output list. Anything else
    used to read as a placeholder, and every later token of that request went uncounted."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=16)
    procs = build_logitsprocs(cfg, "cpu", False)
    sp = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5)
    with pytest.raises(ValueError, match="request at index 0: field 'output_tok_ids'"):
        procs.update_state(BatchUpdate(1, [], [(0, sp, [1], [3, junk])], []))
    out = [3]
    procs.update_state(BatchUpdate(1, [], [(0, sp, [1], out)], []))
    before = [v.clone() for v in procs.pipeline.arena.views]
    out.extend([junk, 4])
    add = BatchUpdate(2, [], [(1, SamplingParams(logit_bias={2: 1.0}), None, [])], [])
    with pytest.raises(ValueError, match="request at index 0: field 'output_tok_ids'"):
        procs.update_state(add)
    assert all(torch.equal(a, b) for a, b in zip(before, procs.pipeline.arena.views, strict=True))
    assert procs.pipeline.status[0] == 1  # the add in the rejected step did not land
    out[1] = 5  # the engine repairs its list: the request's later tokens count again
    procs.update_state(add)
    assert procs.pipeline.core.penalties_counted(0) == [3, 5, 4]


def test_a_big_capacity_costs_no_memory_until_used() -> None:
    """max_num_seqs=65536 with every table: the buffers are zeroed lazily (fresh pages), so
    building does not write gigabytes (4.25 GB of RSS, and 25 s, when every page was written up
    front). Memory is what is checked; the time follows from it."""
    script = textwrap.dedent(
        """
        import resource
        import torch
        from logitsproc_rs import EngineConfig, build_logitsprocs
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        procs = build_logitsprocs(EngineConfig(max_num_seqs=65536, vocab_size=32000), "cpu", False)
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(grew // 1024)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) < 400, f"building grew the RSS by {out.stdout.strip()} MiB"


def test_a_config_error_names_the_config_field_not_a_request() -> None:
    cfg = EngineConfig(
        max_num_seqs=2, vocab_size=8, reasoning_start_token_ids=[1], reasoning_end_token_ids=[9]
    )
    with pytest.raises(ValueError, match="config field 'reasoning_end_token_ids'") as e:
        build_logitsprocs(cfg, "cpu", False)
    assert "request" not in str(e.value)
