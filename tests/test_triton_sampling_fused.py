"""The fused Triton tail (``kernels/_triton_sampling.py``, ``sample_fused_triton``, issue 41's
CUDA half) under ``TRITON_INTERPRET=1``, against the two paths it stands in for.

As ``test_triton_sampling.py``: the checks run in one subprocess (this file as a script, the
interpreter on before triton is imported) and report per check:

* ``vs_cpu_fused``: seeded random batches (V from 7 to 2,500; each of temperature, min-p,
  top-n-sigma, typical-p, epsilon, eta, XTC (firing on some rows, not on others), top-k,
  top-p alone and all combined; ties, ``-inf`` entries, a row of all ``-inf``, a row with one
  finite value) through the kernel and through the CPU fused pass (``tail.fused_gumbel_``,
  ``rust/src/sampling/fused.rs``). Every row is classified (``classify``): ``same`` (the same
  processed logits, bit for bit, and token), ``p1_zero_prob`` (a ``p == 1`` row of a batch
  with top-p: the CPU pass masks entries whose float32 probability is 0, more than 80 below
  the max; this kernel keeps them; the token is the same), ``boundary`` (the kept sets differ
  by entries of one value, at a threshold: the float rounding the module docs allow) or
  ``other`` (a failure).
* ``vs_separate``: the processors one by one (``build_logitsprocs`` with the truncations and
  XTC, ``apply_temperature`` then ``apply_each``: torch's float32 statistics, XTC's own
  draws, seeded rows and not, the same ``u`` the plan drew) followed by the existing Triton
  draw (``sample_batch_invariant_triton``), against the kernel fed the same rows' values
  through ``_fused.fused_plan`` and ``fused_gumbel_triton_`` (as the ``Sampler`` would call
  it), over steps of random requests; classified the same way.
* ``soak`` (``-m soak`` only): ``vs_cpu_fused`` at V up to 151,936, every step on.
* ``edges``: steps that keep only the max and its ties, flat rows (sigma 0), top-k 0.
* ``batch_invariance``: one request's row alone and at row 3 of 6 among other requests: the
  same processed row and token.

Outside the subprocess, ``test_fused_kernel_compiles_for_cuda_without_a_gpu`` builds the
kernel for sm_90 (Triton's compiler and ptxas, no GPU): what the interpreter cannot check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _background
import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve()
HAS_TRITON = importlib.util.find_spec("triton") is not None
NEG_INF = float("-inf")
STEPS = (
    "temperature",
    "log_min_p",
    "top_n_sigma",
    "typical_p",
    "epsilon",
    "eta",
    "xtc",
    "top_k",
    "top_p",
)
#: A step's keywords of ``sample_fused_triton`` (the step's own name where not listed).
KEYS = {"xtc": ("xtc_probability", "xtc_threshold", "xtc_u")}
#: The per-row steps of the CPU pass and ``fused_plan`` (not temperature, top-k, top-p).
PLAN_KEYS = ("log_min_p", "top_n_sigma", "typical_p", "epsilon", "eta", *KEYS["xtc"])


# ---------------------------------------------------------------------------------------------
# Random rows and values


def _log_min_p(m: float) -> float:
    return float(np.log(np.float32(m))) if m > 0 else NEG_INF


def random_values(rng: np.random.Generator, rows: int, vocab: int, on: set[str]) -> dict:
    """Per keyword of the steps in ``on``, one value per row (a quarter of the rows neutral;
    XTC's ``u`` uniform, so it fires on some rows and not on others)."""
    pick = {
        "temperature": [1.0, 0.3, 0.7, 1.6],
        "log_min_p": [NEG_INF, _log_min_p(0.02), _log_min_p(0.1), _log_min_p(0.3)],
        "top_n_sigma": [0.0, 0.5, 1.5, 3.0],
        "typical_p": [1.0, 0.3, 0.7, 0.95],
        "epsilon": [0.0, 1e-4, 3e-3, 0.02],
        "eta": [0.0, 1e-4, 3e-3, 0.02],
        "xtc_probability": [0.0, 0.5, 1.0, 1.0],
        "xtc_threshold": [0.01, 0.05, 0.1, 0.3],
        "xtc_u": [float(u) for u in np.float32(rng.random(4))],
        "top_k": [vocab, 1, 5, max(2, vocab // 3)],  # off: V, the Sampler's convention
        "top_p": [1.0, 0.3, 0.8, 0.95],
    }
    keys = [k for s in on for k in KEYS.get(s, (s,))]
    return {k: [pick[k][int(rng.integers(0, 4))] for _ in range(rows)] for k in keys}


def random_rows(rng: np.random.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Normal rows of random scale; some with ties, some with ``-inf`` entries, some with
    entries 150 below the rest; one all ``-inf`` and one with a single finite value."""
    x = rng.normal(0, 1, (rows, vocab)) * rng.choice([0.5, 3.0, 8.0], (rows, 1))
    for r in range(rows):
        kind = int(rng.integers(0, 4))
        if kind == 1:
            x[r] = np.round(x[r] * 2) / 2  # runs of equal values
        elif kind == 2:
            x[r, rng.random(vocab) < 0.3] = NEG_INF
        elif kind == 3:  # float32 probability 0 (what top-p at p == 1 masks on the CPU)
            x[r, rng.random(vocab) < 0.2] = -150.0
    if rows >= 4:
        x[rows - 1] = NEG_INF
        x[rows - 2, :] = NEG_INF
        x[rows - 2, int(rng.integers(0, vocab))] = 1.5
    return torch.from_numpy(x.astype(np.float32))


def run_triton(x: torch.Tensor, vals: dict, seeds: list[int], positions: list[int]):
    from logitsproc_rs.kernels._triton_sampling import sample_fused_triton

    def t(name: str, dtype: torch.dtype) -> torch.Tensor | None:
        return torch.tensor(vals[name], dtype=dtype) if name in vals else None

    f32 = torch.float32
    return sample_fused_triton(
        x,
        torch.tensor(seeds),
        torch.tensor(positions),
        temperature=t("temperature", f32),
        log_min_p=t("log_min_p", f32),
        top_n_sigma=t("top_n_sigma", f32),
        typical_p=t("typical_p", f32),
        epsilon=t("epsilon", f32),
        eta=t("eta", f32),
        xtc_probability=t("xtc_probability", f32),
        xtc_threshold=t("xtc_threshold", f32),
        xtc_u=t("xtc_u", f32),
        top_k=t("top_k", torch.int64),
        top_p=t("top_p", f32),
    )


def run_cpu_fused(x: torch.Tensor, vals: dict, seeds: list[int], positions: list[int]):
    from logitsproc_rs import _tail as tail

    rows = x.shape[0]
    steps = {s: vals[s] for s in PLAN_KEYS if s in vals}
    k = torch.tensor(vals["top_k"]) if "top_k" in vals else None
    p = torch.tensor(vals["top_p"], dtype=torch.float32) if "top_p" in vals else None
    temp = vals.get("temperature")
    return tail.fused_gumbel_(x, temp, steps, k, p, seeds, positions, [True] * rows)


# ---------------------------------------------------------------------------------------------
# The classification of a row


KINDS = ("same", "p1_zero_prob", "boundary", "other")


def classify(
    got: torch.Tensor, want: torch.Tensor, tok: int, want_tok: int, p: float | None
) -> str:
    """One row: ``got`` (the kernel's processed row and token) against ``want``."""
    kg, kw = got > NEG_INF, want > NEG_INF
    both = kg & kw
    if not torch.equal(got[both], want[both]):
        return "other"  # a kept entry changed value: never allowed
    if torch.equal(kg, kw):
        return "same" if tok == want_tok or not bool(kg.any()) else "other"
    diff = kg ^ kw
    mx = float(got[kg].max()) if bool(kg.any()) else NEG_INF
    if p == 1.0 and bool((kg >= kw).all()) and bool((got[diff] < mx - 80).all()):
        return "p1_zero_prob" if tok == want_tok else "other"
    # One boundary value apart: the differing entries share one value, and it sits at the
    # bottom of the larger kept set.
    vals = torch.cat([got[diff & kg], want[diff & kw]]).unique()
    larger = got[kg] if int(kg.sum()) > int(kw.sum()) else want[kw]
    if vals.numel() == 1 and float(vals[0]) == float(larger.min()):
        return "boundary"
    return "other"


def _count(out: dict[str, int], kind: str) -> None:
    out[kind] = out.get(kind, 0) + 1


# ---------------------------------------------------------------------------------------------
# The checks (run in the subprocess)


def check_vs_cpu_fused(device: str) -> dict[str, int]:
    rng = np.random.default_rng(4141)
    out = dict.fromkeys(KINDS, 0) | {"rows": 0, "batches": 0, "masked": 0, "no_finite": 0}
    combos = [{s} for s in STEPS] + [set(STEPS), set(STEPS) - {"top_k", "top_p"}]
    for ci, on in enumerate(combos):
        for vocab in (7, 300, 2_500) if ci % 2 == 0 else (40, 1_200):
            rows = 6
            x = random_rows(rng, rows, vocab)
            vals = random_values(rng, rows, vocab, on)
            seeds = [int(s) for s in rng.integers(-(2**62), 2**62, rows)]
            positions = [int(q) for q in rng.integers(0, 10_000, rows)]
            a, b = x.clone(), x.clone().to(device)
            want_tok = run_cpu_fused(a, vals, seeds, positions)
            tok = run_triton(b, vals, seeds, positions).cpu()
            b = b.cpu()
            out["batches"] += 1
            for r in range(rows):
                if not bool((x[r] > NEG_INF).any()):  # token 0 (module docs)
                    assert int(tok[r]) == 0 and bool((b[r] == NEG_INF).all())
                    out["no_finite"] += 1
                p = vals["top_p"][r] if "top_p" in vals else None
                _count(out, classify(b[r], a[r], int(tok[r]), int(want_tok[r]), p))
                out["rows"] += 1
                out["masked"] += int(bool((b[r] == NEG_INF).sum() > (x[r] == NEG_INF).sum()))
    return out


def check_vs_separate(device: str) -> dict[str, int]:
    from logitsproc_rs import (
        BatchUpdate,
        EngineConfig,
        SamplingMetadata,
        SamplingParams,
        build_logitsprocs,
    )
    from logitsproc_rs._fused import fused_plan
    from logitsproc_rs.builtin import (
        EpsilonCutoffLogitsProcessor,
        EtaCutoffLogitsProcessor,
        TopNSigmaLogitsProcessor,
        TypicalPLogitsProcessor,
        XTCLogitsProcessor,
    )
    from logitsproc_rs.kernels._triton_sampling import (
        fused_gumbel_triton_,
        sample_batch_invariant_triton,
    )
    from logitsproc_rs.sampler import apply_temperature

    vocab = 600
    cfg = EngineConfig(max_num_seqs=8, vocab_size=vocab)
    opt_in = [
        TopNSigmaLogitsProcessor,
        TypicalPLogitsProcessor,
        EpsilonCutoffLogitsProcessor,
        EtaCutoffLogitsProcessor,
        XTCLogitsProcessor,
    ]
    # Two pipelines fed alike: the plan takes XTC's draws of a step from one, the separate
    # path's apply from the other.
    fused, procs = (build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=opt_in) for _ in "ab")
    rng = np.random.default_rng(7)
    out = dict.fromkeys(KINDS, 0) | {"rows": 0, "steps": 0, "xtc_rows": 0}
    rows = 6
    for step in range(6):
        params = [
            SamplingParams(
                temperature=float(rng.choice([0.5, 1.0, 1.4])),
                top_k=int(rng.choice([0, 0, 5, 200])),
                top_p=float(rng.choice([1.0, 0.9, 0.6])),
                min_p=float(rng.choice([0.0, 0.05, 0.2])),
                top_n_sigma=float(rng.choice([0.0, 1.0, 2.5])),
                epsilon_cutoff=float(rng.choice([0.0, 3e-4, 0.01])),
                eta_cutoff=float(rng.choice([0.0, 3e-4, 0.01])),
                typical_p=float(rng.choice([1.0, 0.9, 0.5])),
                xtc_probability=float(rng.choice([0.0, 0.5, 1.0])),
                xtc_threshold=float(rng.choice([0.02, 0.1])),
                seed=int(rng.integers(0, 1_000)) if rng.random() < 0.6 else None,
            )
            for _ in range(rows)
        ]
        added = [(r, params[r], [1], []) for r in range(rows)]
        for p in (fused, procs):
            p.update_state(BatchUpdate(rows, [], added, []))
        x = torch.from_numpy(rng.normal(0, 3, (rows, vocab)).astype(np.float32))
        positions = list(range(step, step + rows))
        md = SamplingMetadata.from_params(params, vocab, "cpu", None, positions, [3] * rows)
        assert md.temperature is not None and md.seeds is not None
        seeds = [0 if s is None else int(s) for s in md.seeds]
        start = torch.get_rng_state()  # the unseeded rows' u: the same global draws
        plan = fused_plan(fused, x)
        assert plan is not None
        torch.set_rng_state(start)
        # The separate path: temperature, each processor, then the existing Triton draw.
        sep = apply_temperature(x.clone(), md.temperature, md.all_random)
        sep = procs.apply_each(procs.argmax_invariant, sep)
        if "xtc_u" in plan:
            out["xtc_rows"] += int((plan["xtc_u"] < plan["xtc_probability"]).sum())
        sep_tok = sample_batch_invariant_triton(
            sep, md.top_k, md.top_p, torch.tensor(seeds), torch.tensor(positions)
        )
        # The kernel as the Sampler would call it (all rows random: temperature as is).
        assert md.all_random
        got = x.clone()
        tok = fused_gumbel_triton_(got, md.temperature, plan, md.top_k, md.top_p, seeds, positions)
        out["steps"] += 1
        for r in range(rows):
            _count(out, classify(got[r], sep[r], int(tok[r]), int(sep_tok[r]), None))
            out["rows"] += 1
    return out


def check_batch_invariance(device: str) -> dict[str, int]:
    rng = np.random.default_rng(12)
    vocab = 900
    me = torch.from_numpy(rng.normal(0, 3, vocab).astype(np.float32))
    mine = {"temperature": 0.8, "log_min_p": _log_min_p(0.01), "top_n_sigma": 2.0,
            "typical_p": 0.95, "epsilon": 1e-4, "eta": 1e-3, "xtc_probability": 1.0,
            "xtc_threshold": 0.05, "xtc_u": 0.5, "top_k": 300, "top_p": 0.9}  # fmt: skip
    tokens, rows_out = [], []
    for size, at in ((1, 0), (6, 3)):
        x = random_rows(rng, size, vocab) if size > 1 else me.unsqueeze(0).clone()
        x[at] = me
        vals = random_values(rng, size, vocab, set(STEPS))
        for s in mine:
            vals[s][at] = mine[s]
        seeds = [int(s) for s in rng.integers(0, 2**40, size)]
        positions = [int(q) for q in rng.integers(0, 99, size)]
        seeds[at], positions[at] = 5, 17
        tok = run_triton(x, vals, seeds, positions)
        tokens.append(int(tok[at]))
        rows_out.append(x[at].clone())
    assert len(set(tokens)) == 1, tokens
    assert torch.equal(rows_out[0], rows_out[1])
    return {"batches": 2, "kept": int((rows_out[0] > NEG_INF).sum())}


def check_edges(device: str) -> dict[str, int]:
    """Steps that keep only the max (and its ties), flat rows (sigma 0; every typicality
    score 0, typical-p keeps them all; every entry qualifies for XTC at one probability, XTC
    masks none), top-k 0 (off, as ``V``): against the CPU pass, each row the same."""
    rng = np.random.default_rng(99)
    vocab = 50
    x = torch.from_numpy(rng.normal(0, 2, (8, vocab)).astype(np.float32))
    x[1] = 0.25  # flat: sigma 0, every entry the max
    x[2, :5] = float(x[2].max()) + 1.0  # five tied maxima
    x[5] = 0.25
    vals = {
        "temperature": [1.0, 0.5, 1.0, 2.0, 1.0, 1.0, 0.9, 1.0],
        "log_min_p": [0.0, 0.0, 0.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF],
        "top_n_sigma": [0.0, 1.0, 0.0, 0.01, 0.0, 3.0, 0.0, 0.0],
        "epsilon": [0.0, 0.0, 0.5, 0.0, 0.9, 0.5, 0.0, 0.0],
        "eta": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 0.0],
        "typical_p": [1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        "xtc_probability": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
        "xtc_threshold": [0.01] * 8,
        "xtc_u": [0.0] * 8,
        "top_k": [vocab] * 7 + [3],
        "top_p": [1.0] * 7 + [0.5],
    }
    seeds, positions = list(range(8)), list(range(100, 108))
    a, b = x.clone(), x.clone()
    want_tok = run_cpu_fused(a, vals, seeds, positions)
    tok = run_triton(b, vals, seeds, positions)
    kinds = [classify(b[r], a[r], int(tok[r]), int(want_tok[r]), None) for r in range(8)]
    assert kinds == ["same"] * 8, kinds
    assert int((b[0] > NEG_INF).sum()) == 1 and int((b[2] > NEG_INF).sum()) == 5
    assert bool((b[1] > NEG_INF).all()) and bool((b[5] > NEG_INF).all())
    # top-k 0 is off, as V.
    c = x.clone()
    run_triton(c, vals | {"top_k": [0] * 7 + [3]}, seeds, positions)
    assert torch.equal(c, b)
    return {"rows": 8}


def check_soak(device: str) -> dict[str, int]:
    """``vs_cpu_fused`` at serving sizes: 12 batches of 4 rows, every step on, V up to
    151,936."""
    rng = np.random.default_rng(2026)
    out = dict.fromkeys(KINDS, 0) | {"rows": 0}
    for i in range(12):
        vocab = (4_096, 32_000, 151_936)[i % 3]
        rows = 4
        x = random_rows(rng, rows, vocab)
        vals = random_values(rng, rows, vocab, set(STEPS))
        seeds = [int(s) for s in rng.integers(0, 2**40, rows)]
        positions = [int(q) for q in rng.integers(0, 10_000, rows)]
        a, b = x.clone(), x.clone()
        want_tok = run_cpu_fused(a, vals, seeds, positions)
        tok = run_triton(b, vals, seeds, positions)
        for r in range(rows):
            kind = classify(b[r], a[r], int(tok[r]), int(want_tok[r]), vals["top_p"][r])
            _count(out, kind)
            out["rows"] += 1
    return out


CHECKS: dict[str, Callable[[str], dict]] = {
    "vs_cpu_fused": check_vs_cpu_fused,
    "edges": check_edges,
    "vs_separate": check_vs_separate,
    "batch_invariance": check_batch_invariance,
}


def _main() -> None:
    """The subprocess: every check on the CPU under the interpreter; JSON on stdout."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, str(HERE.parent / "vllm_engine"))
    import interpreter_speed  # noqa: F401  (no re-patching per helper call, no overflow checks)

    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    checks = {"soak": check_soak} if "--soak" in sys.argv else CHECKS
    for name, check in checks.items():
        t0 = time.perf_counter()
        try:
            results[name] = {"ok": True, "stats": check("cpu")}
        except Exception:  # reported per check by the parent, with its traceback
            results[name] = {"ok": False, "error": traceback.format_exc()[-1500:]}
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
    print("RESULTS " + json.dumps(results))


# ---------------------------------------------------------------------------------------------
# The tests


_background.interpreter_script(__name__, HERE)


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    return _background.results(_background.result(__name__, "interpreted"))


def _stats(results: dict[str, Any], name: str) -> dict[str, Any]:
    r = results[name]
    assert r["ok"], r.get("error")
    return r["stats"]


def test_fused_kernel_against_the_cpu_fused_pass(interpreted) -> None:
    s = _stats(interpreted, "vs_cpu_fused")
    assert s["rows"] == 6 * 28 and s["other"] == 0, s
    assert s["no_finite"] == 28, s
    # The documented p == 1 difference occurs (the rows exercise it), on a minority of rows.
    assert 0 < s["p1_zero_prob"] <= s["rows"] // 5, s
    assert s["boundary"] <= 2, s  # float rounding at a threshold: (almost) never on these rows
    assert s["masked"] >= s["rows"] // 3, s  # the steps did mask


def test_fused_kernel_against_the_separate_processors(interpreted) -> None:
    s = _stats(interpreted, "vs_separate")
    assert s["rows"] == 36 and s["other"] == 0, s
    assert s["boundary"] <= 2, s
    assert s["xtc_rows"] >= 5, s  # XTC fired on some rows


def test_fused_kernel_edges(interpreted) -> None:
    assert _stats(interpreted, "edges")["rows"] == 8


def test_fused_kernel_is_batch_invariant(interpreted) -> None:
    s = _stats(interpreted, "batch_invariance")
    assert s["batches"] == 2 and s["kept"] > 1


@pytest.mark.soak
def test_fused_kernel_against_the_cpu_fused_pass_at_serving_sizes() -> None:
    """``check_soak`` in its own interpreter subprocess (about two minutes of one core)."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    env = _background.session_env(TRITON_INTERPRET="1")
    python_dir = str(HERE.parent.parent / "python")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (python_dir, env.get("PYTHONPATH"))))
    proc = subprocess.run(
        [sys.executable, str(HERE), "--soak"], env=env, capture_output=True, text=True
    )
    s = _stats(_background.results(proc), "soak")
    assert s["rows"] == 48 and s["other"] == 0, s
    assert s["boundary"] <= 2, s


@pytest.mark.parametrize("every_step", [True, False])
def test_fused_kernel_compiles_for_cuda_without_a_gpu(every_step: bool) -> None:
    """What the interpreter cannot check (the compiler's typing of the runtime branches, the
    float64 statistics, libdevice's division, square root and logarithms): the kernel builds
    for sm_90 to a cubin with Triton's own ptxas, no GPU; with every step, and with none but
    the draw."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("under TRITON_INTERPRET the kernels are not compiled")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from logitsproc_rs.kernels import _triton_sampling as ts

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("triton has no NVIDIA backend")
    target = GPUTarget("cuda", 90, 32)
    opts = {"num_warps": 8, "enable_fp_fusion": False}
    sig = {"x_ptr": "*fp32", "stride": "i32"}
    for name in ("t_ptr", "minp_ptr", "sigma_ptr", "typ_ptr", "eps_ptr", "eta_ptr"):
        sig[name] = "*fp32"
    for name in ("xtc_prob_ptr", "xtc_thr_ptr", "xtc_u_ptr"):
        sig[name] = "*fp32"
    sig.update({"k_ptr": "*i64", "p_ptr": "*fp32", "seed_ptr": "*i64", "pos_ptr": "*i64"})
    sig.update({"out_ptr": "*i64", "V": "i32"})
    flags = (
        "HAS_T",
        "HAS_MINP",
        "HAS_SIGMA",
        "HAS_TYP",
        "HAS_EPS",
        "HAS_ETA",
        "HAS_EXP",
        "HAS_XTC",
        "HAS_K",
        "HAS_P",
    )
    consts: dict[str, Any] = dict.fromkeys(flags, every_step)
    consts |= {"LIBDEVICE": True, "DIGIT": ts.digit_bits(torch.device("cuda")), "BLOCK": 1024}
    sig.update(dict.fromkeys(consts, "constexpr"))
    src = ASTSource(ts._fused_kernel, sig, consts)
    assert triton.compile(src, target=target, options=opts).asm["cubin"]


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    _main()
