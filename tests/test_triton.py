"""The Triton kernels (``logitsproc_rs.kernels``) against the torch-op path, bit for bit.

On the CPU the kernels run under Triton's interpreter, which must be switched on before triton
is imported: the checks run in one subprocess (this file run as a script, with
``TRITON_INTERPRET=1``), so nothing leaks into other test modules, and report per check. On a
GPU (``pytest -m cuda``) the same checks run in process on CUDA tensors, compiled.

Each check compares bit patterns (``-0.0`` vs ``+0.0`` and NaN included):

* every kernel alone on adversarial values (NaN / ±inf / ±0 rows, logits exactly at the MinP
  threshold and one ulp either side, ``-0.0`` penalties, both repetition forms, padded triples,
  bitmask widths that cut a word, negative row indices, half-precision logits, row strides
  larger than the vocabulary, row maps with repeats);
* the whole pipeline over the differential churn of ``test_pipeline`` (every processor, async
  placeholders filled before apply, thinking markers): V1 rows and stable slots with draft rows,
  one pipeline on the torch path and one on the kernels, both on the emulated device path.

A check also counts what it exercised and which kernels ran, so a dispatch that silently falls
back to torch, or a churn that stops reaching a processor, fails.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _background
import pytest
import torch

HERE = Path(__file__).resolve()
HAS_TRITON = importlib.util.find_spec("triton") is not None
KERNELS = ("min_p_", "penalties_", "sparse_", "keep_only_", "token_bitmask_")


# ---------------------------------------------------------------------------------------------
# Checks: each runs on one device and returns what it exercised; a mismatch raises.


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    diff = _bits(got) != _bits(want)
    if bool(diff.any()):
        idx = diff.nonzero()[:5].tolist()
        pairs = [(i, float(got[tuple(i)]), float(want[tuple(i)])) for i in idx]
        raise AssertionError(f"{what}: {int(diff.sum())} elements differ, e.g. {pairs}")


def _ops():
    from logitsproc_rs import kernels

    ops = kernels.ops()
    assert ops is not None, "triton does not import"
    return ops


def _awkward_logits(g: torch.Generator, rows: int, vocab: int, device: str) -> torch.Tensor:
    """Gaussian rows at mixed scales, with special rows and values mixed in."""
    x = torch.randn(rows, vocab, generator=g) * torch.tensor([1.0, 4.0, 30.0, 0.01]).repeat(rows)[
        :rows
    ].unsqueeze(1)
    x[0, :5] = torch.tensor([0.0, -0.0, math.inf, -math.inf, 1.0])  # a +inf row
    x[1] = -math.inf  # every logit -inf
    x[2, 3] = math.nan  # a NaN row
    x[3, ::7] = -0.0
    x[4] = 2.5  # all equal
    x[5, ::3] = -math.inf
    return x.to(device)


def check_min_p(device: str) -> dict[str, int]:
    return _sum(_min_p(device, v) for v in (300, 9000))  # 9000: three blocks of 4096


def _min_p(device: str, vocab: int) -> dict[str, int]:
    from logitsproc_rs.builtin.min_p import min_p_mask_

    g = torch.Generator().manual_seed(1)
    rows = 12
    x = _awkward_logits(g, rows, vocab, "cpu")
    lmp = torch.tensor([0.05, 0.1, 0.3, 1.0, 1e-6, 0.5] * 2, dtype=torch.float32).log()
    lmp[7] = -math.inf  # a row without min_p
    # Ties: logits exactly at max + ln(min_p) (kept), and one ulp either side.
    for r in (6, 8, 9, 10, 11):
        thr = x[r].max() + lmp[r]
        x[r, 10] = thr
        x[r, 11] = torch.nextafter(thr, torch.tensor(-math.inf))
        if lmp[r] < 0:  # (with min_p = 1 the threshold is the max itself)
            x[r, 12] = torch.nextafter(thr, torch.tensor(math.inf))
    x, lmp = x.to(device), lmp.to(device)
    masked = 0
    # Plain, through a row map with repeats, and with a row stride above the vocabulary.
    row_map = torch.tensor([3, 0, 0, 11, 7, 5, 9, 2, 1, 4, 6, 8], device=device)
    for name, m in (("plain", None), ("row map", row_map)):
        slots = lmp if m is None else lmp[m]
        want = min_p_mask_(x.clone(), slots.unsqueeze(1))
        got = _ops().min_p_(x.clone(), lmp, m)
        assert_same_bits(got, want, f"min_p ({name})")
        masked += int((want == -math.inf).sum() - (x == -math.inf).sum())
    wide = torch.full((rows, vocab + 37), 7.0, device=device)
    view = wide[:, :vocab]
    view.copy_(x)
    _ops().min_p_(view, lmp, None)
    assert_same_bits(view, min_p_mask_(x.clone(), lmp.unsqueeze(1)), "min_p (row stride)")
    assert bool((wide[:, vocab:] == 7.0).all()), "min_p wrote past a row"
    tie_rows = [6, 8, 9, 10, 11]
    kept = int((view[tie_rows, 10] != -math.inf).sum())
    assert kept == len(tie_rows) and bool((view[tie_rows, 11] == -math.inf).all())
    return {"masked": masked, "ties_kept": kept}


def check_penalties(device: str) -> dict[str, int]:
    return _sum(_penalties(device, v) for v in (200, 4500))  # 4500: three blocks of 2048


def _penalties(device: str, vocab: int) -> dict[str, int]:
    from logitsproc_rs.builtin.penalties import apply_penalties_

    flag = 1 << 30
    g = torch.Generator().manual_seed(2)
    slots = 9
    x = _awkward_logits(g, slots, vocab, "cpu")
    cells = torch.randint(0, 4, (slots, vocab), generator=g, dtype=torch.int32)
    cells[torch.rand(slots, vocab, generator=g) < 0.5] = 0
    cells |= torch.where(torch.rand(slots, vocab, generator=g) < 0.2, flag, 0).to(torch.int32)
    rep = torch.tensor([1.0, 1.3, 0.7, 1.0, 1.0, 1.1, 2.0, 0.3, 1.0], dtype=torch.float32)
    freq = torch.tensor([0.0, 0.5, -0.3, -0.0, 0.0, 0.1, 2.0, -2.0, 0.0], dtype=torch.float32)
    pres = torch.tensor([0.0, 0.2, 0.0, 0.0, -0.0, -1.5, 0.0, 0.7, 0.0], dtype=torch.float32)
    x, cells = x.to(device), cells.to(device)
    rep, freq, pres = rep.to(device), freq.to(device), pres.to(device)
    forms_differ = 0
    row_map = torch.tensor([8, 1, 1, 4, 3, 7, 0, 6, 2, 5, 5], device=device)
    for m in (None, row_map):
        idx = torch.arange(slots, device=device) if m is None else m
        for divide in (False, True):
            args = (cells[idx], rep[idx, None], freq[idx, None], pres[idx, None], flag)
            want = apply_penalties_(x[idx].clone(), *args, divide=divide)
            got = _ops().penalties_(x[idx].clone(), cells, rep, freq, pres, flag, m, divide)
            assert_same_bits(got, want, f"penalties (divide={divide}, map={m is not None})")
            other = apply_penalties_(x[idx].clone(), *args, divide=not divide)
            forms_differ += int((_bits(other) != _bits(want)).sum())
    return {"forms_differ": forms_differ}


def check_sparse(device: str) -> dict[str, int]:
    return _sum(_sparse(device, n) for n in (40, 3000))  # 3000: several programs


def _sparse(device: str, n: int) -> dict[str, int]:
    g = torch.Generator().manual_seed(3)
    rows, vocab = 6, 1000
    x = _awkward_logits(g, rows, vocab, "cpu").to(device)
    pairs = torch.randperm(rows * vocab, generator=g)[:n]
    r, c = (pairs // vocab).to(torch.int32), (pairs % vocab).to(torch.int32)
    vals = torch.randn(n, generator=g) * 5
    vals[:3] = torch.tensor([0.0, -0.0, math.inf])
    # The core pads to a power of two by repeating the first pair: −0.0 for an add, the same
    # value for a put.
    pad = triton_next_pow2(n) - n
    rp, cp = torch.cat([r, r[:1].repeat(pad)]), torch.cat([c, c[:1].repeat(pad)])
    add_v = torch.cat([vals, torch.full((pad,), -0.0)])
    put_v = torch.cat([vals.clone().fill_(-math.inf), torch.full((pad,), -math.inf)])
    rp, cp, add_v, put_v = rp.to(device), cp.to(device), add_v.to(device), put_v.to(device)
    for add, v in ((True, add_v), (False, put_v), (False, add_v.clone().fill_(1e9))):
        want = x.clone().index_put_((rp, cp), v, accumulate=add)
        got = _ops().sparse_(x.clone(), rp, cp, v, add)
        assert_same_bits(got, want, f"sparse (add={add})")
    return {"triples": n}


def check_allowed(device: str) -> dict[str, int]:
    # 77 cuts the last word; 2100 needs two blocks of 64 words
    return _sum(_allowed(device, v) for v in (77, 2100))


def _allowed(device: str, vocab: int) -> dict[str, int]:
    from logitsproc_rs.builtin.allowed_token_ids import keep_only_

    g = torch.Generator().manual_seed(4)
    rows = 7
    x = _awkward_logits(g, rows, vocab, "cpu").to(device)
    restricted = [1, 4, 6, 2]
    r, c = [], []
    for row in restricted:
        ids = [*sorted(torch.randperm(vocab, generator=g)[: 1 + row * 3].tolist()), vocab - 1]
        r += [row] * len(ids)
        c += ids
    # Padding as the core writes it: the first pair again, the first restricted row again.
    r += [r[0]] * 5
    c += [c[0]] * 5
    rr = torch.tensor(r, dtype=torch.int32, device=device)
    cc = torch.tensor(c, dtype=torch.int32, device=device)
    rest = torch.tensor(restricted + [restricted[0]] * 4, dtype=torch.int64, device=device)
    scratch = torch.zeros(rows + 3, (vocab + 31) // 32, dtype=torch.int32, device=device)
    for _ in range(2):  # twice: the scratch must come back zeroed
        want = keep_only_(x.clone(), rr.long(), cc.long(), rest)
        got = _ops().keep_only_(x.clone(), rr, cc, rest, scratch)
        assert_same_bits(got, want, "allowed ids")
        assert not bool(scratch.any()), "allowed ids left bits in the scratch"
    return {"pairs": len(r)}


def check_bitmask(device: str) -> dict[str, int]:
    from logitsproc_rs import kernels
    from logitsproc_rs.bitmask import apply_token_bitmask_

    g = torch.Generator().manual_seed(5)
    cases = 0
    # width = min(V, 32 * words); 4500 tokens need three blocks of 64 words
    for vocab, words in ((100, 4), (100, 3), (64, 2), (70, 1), (4500, 141)):
        rows = 5
        bm = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=g, dtype=torch.int32)
        bm[1] = -1  # a row that masks nothing
        bm[2, 0] = 0
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = _awkward_logits(g, 8, vocab, "cpu").to(device, dtype)
            for idx in (None, [7, 0, 3, 5, 2], torch.tensor([-1, 0, 2, 4, 6], device=device)):
                x_ = x[:rows] if idx is None else x
                want_in, got_in = x_.clone(), x_.clone()
                kernels.set_default_backend("torch")
                try:
                    want = apply_token_bitmask_(want_in, bm, idx)
                finally:
                    kernels.set_default_backend("triton")
                got = apply_token_bitmask_(got_in, bm, idx)
                assert_same_bits(got, want, f"bitmask (V={vocab}, words={words}, {dtype})")
                cases += 1
    return {"cases": cases}


def _sum(parts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _churn(device: str, seed: int, cap: int, vocab: int, steps: int, slots: bool) -> dict:
    """Two pipelines over the same churn, one on the torch path and one on the kernels, on the
    emulated device path (CPU) or on CUDA; V1 rows, or stable slots with repeated rows."""
    from test_differential import random_logits
    from test_pipeline import HOT_IDS, config, make_sim, phases

    from logitsproc_rs import build_logitsprocs

    cfg = config(cap, vocab)
    emulate = device == "cpu"
    kw: dict[str, Any] = dict(emulate_device=emulate)
    if slots:
        kw.update(stable_slots=True, max_rows=2 * cap)
    torch_path = build_logitsprocs(cfg, device, False, **kw)
    triton_path = build_logitsprocs(cfg, device, False, **kw)
    torch_path.pipeline.kernels = "torch"
    triton_path.pipeline.kernels = "triton"
    sim = make_sim(seed, cap, vocab, placeholders=True)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    seen = dict.fromkeys(
        ("min_p", "logit_bias", "min_tokens", "bad_words", "allowed", "thinking", "penalties"), 0
    )
    slot_of: dict[int, int] = {}
    free = list(range(cap))
    rows_total = 0
    for _ in range(steps):
        update = sim.step()
        rows = sim.batch.rows()
        if slots:
            live = {r.req_id for r in rows}
            for rid in [rid for rid in slot_of if rid not in live]:
                for p in (torch_path, triton_path):
                    p.pipeline.remove_request(slot_of[rid])
                free.append(slot_of.pop(rid))
            for r in rows:
                if r.req_id not in slot_of:
                    slot_of[r.req_id] = free.pop(rng.randrange(len(free)))
                    for p in (torch_path, triton_path):
                        p.pipeline.add_request(
                            slot_of[r.req_id], r.params, r.prompt_token_ids, r.output_token_ids
                        )
            extra = [rng.randrange(len(rows)) for _ in range(rng.randint(0, 3))] if rows else []
            row_to_slot = [slot_of[r.req_id] for r in rows] + [
                slot_of[rows[i].req_id] for i in extra
            ]
            for p in (torch_path, triton_path):
                p.pipeline.step_slots(row_to_slot)
        else:
            extra = []
            torch_path.update_state(update)
            triton_path.update_state(update)
        for r in rows:  # the engine fills async placeholders in before sampling
            out = r.output_token_ids
            if out and out[-1] == -1:
                out[-1] = rng.choice(HOT_IDS)
        logits = random_logits(rng, g, len(rows), vocab)
        if extra:
            logits = torch.cat([logits, logits[extra]])
        logits = logits.to(device)
        want = phases(torch_path, logits, rows=slots)
        got = phases(triton_path, logits, rows=slots)
        for k in range(2):
            assert_same_bits(got[k], want[k], f"churn phase {k + 1} (slots={slots})")
        pipe = triton_path.pipeline
        for name in seen:
            rowspace = slots and name not in ("min_p", "penalties")
            seen[name] += bool(pipe.count("rows." + name if rowspace else name))
        rows_total += logits.shape[0]
    return {"rows": rows_total, **seen}


def check_churn_v1(device: str) -> dict:
    return _sum((_churn(device, 11, 8, 96, 200, False), _churn(device, 13, 24, 300, 60, False)))


def check_churn_slots(device: str) -> dict:
    return _churn(device, 12, 8, 96, 150, slots=True)


CHECKS: dict[str, Callable[[str], dict]] = {
    "min_p": check_min_p,
    "penalties": check_penalties,
    "sparse": check_sparse,
    "allowed": check_allowed,
    "bitmask": check_bitmask,
    "churn_v1": check_churn_v1,
    "churn_slots": check_churn_slots,
}


def _count_launches() -> dict[str, int]:
    """Wraps the kernels' launchers to count calls (what actually ran)."""
    ops = _ops()
    counts = dict.fromkeys(KERNELS, 0)
    for name in KERNELS:
        fn = getattr(ops, name)

        def counted(*a, _fn=fn, _name=name, **k):
            counts[_name] += 1
            return _fn(*a, **k)

        setattr(ops, name, counted)
    return counts


def _main() -> None:
    """The subprocess: run every check on the CPU under the interpreter, print JSON."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    counts = _count_launches()
    results: dict[str, Any] = {}
    for name, check in CHECKS.items():
        before = dict(counts)
        t0 = time.perf_counter()
        try:
            stats = check("cpu")
            results[name] = {"ok": True, "stats": stats}
        except Exception as e:  # reported per check by the parent
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        results[name]["launches"] = {k: counts[k] - before[k] for k in KERNELS}
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
    print("RESULTS " + json.dumps(results))


# ---------------------------------------------------------------------------------------------
# The tests


_background.interpreter_script(__name__, HERE, LOGITSPROC_KERNELS="triton")


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    return _background.results(_background.result(__name__, "interpreted"))


def _passed(results: dict[str, Any], name: str) -> dict[str, Any]:
    r = results[name]
    assert r["ok"], r.get("error")
    return r


# Which kernels each check must have launched (a silent torch fallback fails here).
MUST_LAUNCH = {
    "min_p": ("min_p_",),
    "penalties": ("penalties_",),
    "sparse": ("sparse_",),
    "allowed": ("keep_only_",),
    "bitmask": ("token_bitmask_",),
    "churn_v1": ("min_p_", "penalties_", "sparse_", "keep_only_"),
    "churn_slots": ("min_p_", "penalties_", "sparse_", "keep_only_"),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_kernels_match_the_torch_path_in_the_interpreter(interpreted, name) -> None:
    r = _passed(interpreted, name)
    for kernel in MUST_LAUNCH[name]:
        assert r["launches"][kernel] > 0, f"{name}: {kernel} never ran"
    stats = r["stats"]
    if name.startswith("churn"):
        # Every table had work on some steps, on both sides.
        for table in ("min_p", "logit_bias", "min_tokens", "bad_words", "allowed", "penalties"):
            assert stats[table] > 0, f"{name}: {table} never active"
        assert stats["thinking"] > 0 or name == "churn_slots"
    if name == "penalties":
        # The two repetition forms really differ on these inputs, so the bitwise comparison
        # can tell them apart (and would catch a kernel that picked the wrong one).
        assert stats["forms_differ"] > 0
    if name == "min_p":
        assert stats["masked"] > 0 and stats["ties_kept"] == 10  # 5 tie rows, 2 sizes


def test_dispatch_choices(monkeypatch) -> None:
    from logitsproc_rs import kernels

    x = torch.zeros(2, 3)
    assert not kernels.use_triton(x, "auto")  # CPU logits: torch ops (or Rust) under auto
    assert not kernels.use_triton(x, "torch")
    assert not kernels.use_triton(x.double(), "auto")
    with pytest.raises(ValueError, match="expected one of"):
        kernels.use_triton(x, "cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if HAS_TRITON:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            kernels.use_triton(x, "triton")
    monkeypatch.setenv(kernels.KERNELS_ENV, "bogus")
    kernels.set_default_backend(None)
    try:
        with pytest.raises(ValueError, match="LOGITSPROC_KERNELS"):
            kernels.default_backend()
    finally:
        monkeypatch.delenv(kernels.KERNELS_ENV)
        kernels.set_default_backend(None)
    assert kernels.default_backend() == "auto"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("name", list(CHECKS))
def test_kernels_match_the_torch_path_on_cuda(name) -> None:
    """Compiled kernels on the GPU against the torch ops on the GPU (divide form)."""
    from logitsproc_rs import kernels

    kernels.set_default_backend("triton")
    try:
        stats = CHECKS[name]("cuda")
    finally:
        kernels.set_default_backend(None)
    if name.startswith("churn"):
        assert stats["penalties"] > 0 and stats["min_p"] > 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    _main()
