"""DRY (llama.cpp's ``llama_sampler_dry_apply``, prompt included): the reference's literal
transcription on llama.cpp's worked example and against a second, brute-force statement of the
rule; the core against the reference under seeded churn on every route (one call, vLLM's loop,
the device path, the token feed, stable slots), with windows, breakers, async placeholders and
rewritten outputs; and its bad input.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import routes_match_reference

from logitsproc_rs import (
    BatchUpdate,
    DryLogitsProcessor,
    EngineConfig,
    RequestError,
    SamplingParams,
)
from logitsproc_rs.reference import RefDryLogitsProcessor, ref_dry_penalties
from logitsproc_rs.simulate import ChurnSimulator

V = 12
CAP = 6


def brute_force(
    seq: list[int], mult: float, base: float, allowed: int, breakers: list[list[int]]
) -> dict[int, float]:
    """The rule stated directly (no Z-algorithm, no scan trick): the repetition may not reach
    back past the newest breaker head whose (cut) tail follows it; each earlier end ``j`` whose
    longest common suffix with the whole sequence is at least ``allowed`` (capped by the
    breaker limit) gives the next token that length; the largest wins."""
    n = len(seq)
    if n <= allowed:
        return {}
    cut = [b[:21] for b in breakers]
    limit = n
    for h in range(n - 1, -1, -1):
        tails = [len(b) - 1 for b in cut if b[0] == seq[h] and seq[h : h + len(b)] == b]
        if tails:
            limit = (n - 1 - h) - max(tails)
            break
    if limit < allowed:
        return {}
    best: dict[int, int] = {}
    for j in range(n - 1):
        z = 0
        while z <= j and seq[j - z] == seq[n - 1 - z]:
            z += 1
        z = min(z, limit)
        if z >= allowed:
            best[seq[j + 1]] = max(best.get(seq[j + 1], 0), z)
    single = {b[0] for b in cut if len(b) == 1}
    b32 = np.float32(base)
    max_exp = 0
    if b32 > np.float32(1.000001):
        max_exp = int(np.float32(88.7228391) / np.float32(math.log(float(b32))))
    out = {}
    for t, length in best.items():
        if t in single:
            continue
        e = length - allowed
        if max_exp > 0:
            e = min(e, max_exp)
        out[t] = float(np.float32(float(np.float32(mult)) * math.pow(float(b32), e)))
    return out


def test_llama_cpp_worked_example() -> None:
    # a b c c b c y a b c -> repeat counts 0 0 3 1 0 2 0 0 0 0: c extends `a b c` (3), y
    # extends `b c` (2); b's `c` (1) is below allowed_length 2.
    a, b, c, y = 1, 2, 3, 4
    seq = [a, b, c, c, b, c, y, a, b, c]
    got = ref_dry_penalties(seq, 1.0, 2.0, 2, [])
    assert got == {c: 2.0, y: 1.0}
    got1 = ref_dry_penalties(seq, 1.0, 2.0, 1, [])
    assert got1 == {c: 4.0, b: 1.0, y: 2.0}


# llama.cpp's tests/test-sampling.cpp, test_dry: (probs, last tokens, expected probs,
# multiplier, base, allowed length, last_n, breakers); logits are log(probs).
LLAMA_CPP_TEST_DRY = [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
    (
        [0.2] * 5,
        [0, 1, 2, 0, 1],
        [0.241818, 0.241818, 0.032727, 0.241818, 0.241818],
        2.0,
        1.1,
        2,
        5,
        [],
    ),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
]


@pytest.mark.parametrize("case", LLAMA_CPP_TEST_DRY)
def test_llama_cpp_test_sampling_cases(case: Any) -> None:
    probs, tokens, expected, mult, base, allowed, last_n, breakers = case
    logits = torch.tensor(probs).log()
    for t, p in ref_dry_penalties(tokens[-last_n:], mult, base, allowed, breakers).items():
        logits[t] -= p
    got = torch.softmax(logits, 0)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-5), got
    # The core on the same sequence (as a prompt) gives the reference's logits exactly.
    cfg = EngineConfig(max_num_seqs=1, vocab_size=len(probs))
    ours, ref = DryLogitsProcessor(cfg, "cpu", False), RefDryLogitsProcessor(cfg, "cpu", False)
    params = SamplingParams(
        dry_multiplier=mult,
        dry_base=base,
        dry_allowed_length=allowed,
        dry_penalty_last_n=last_n,
        dry_sequence_breakers=breakers,
    )
    for proc in (ours, ref):
        proc.update_state(_update(1, added=[(0, params, list(tokens), [])]))
    row = torch.tensor(probs).log().view(1, -1)
    assert torch.equal(ours.apply(row.clone()), ref.apply(row.clone()))


@pytest.mark.parametrize("seed", range(6))
def test_reference_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        seq = [rng.randrange(3) for _ in range(rng.randint(0, 30))]
        allowed = rng.randint(1, 4)
        breakers = [
            [rng.randrange(3) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(0, 2))
        ]
        mult = rng.choice((0.8, 1.0, 3.5))
        base = rng.choice((1.0, 1.000001, 1.5, 1.75, 3.0))
        want = brute_force(seq, mult, base, allowed, breakers)
        assert ref_dry_penalties(seq, mult, base, allowed, breakers) == want, (seq, breakers)


def make_params(rng: random.Random) -> SamplingParams:
    if rng.random() < 0.2:
        return SamplingParams(max_tokens=None)
    breakers = rng.choice(
        (None, [[0]], [[0, 1]], [[1, 0, 1], [2]], [[3, 3], [3, 3, 1], [4]], [[1] * 25])
    )
    return SamplingParams(
        dry_multiplier=rng.choice((0.0, 0.8, 1.0, 2.5)),
        dry_base=rng.choice((1.0, 1.75, 2.0, 40.0)),
        dry_allowed_length=rng.choice((1, 2, 2, 3, 5)),
        dry_penalty_last_n=rng.choice((-1, -1, 0, 4, 9, 30)),
        dry_sequence_breakers=breakers,
        max_tokens=None,
    )


def small_tokens(rng: random.Random, _req: Any) -> int:
    return rng.randrange(5)


class CountingRef(RefDryLogitsProcessor):
    changed = 0

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        before = logits.clone()
        out = super().apply(logits)
        CountingRef.changed += int((out != before).sum())
        return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_route_matches_the_reference(seed: int) -> None:
    sim = ChurnSimulator(
        CAP, V, seed, make_params, next_token=small_tokens, prompt_len=(0, 12), max_tokens=(4, 80)
    )
    g = torch.Generator().manual_seed(seed)
    CountingRef.changed = 0
    routes_match_reference(
        DryLogitsProcessor,
        CountingRef,
        sim,
        CAP,
        V,
        lambda _k, rows: torch.randn(rows, V, generator=g),
        steps=160,
    )
    assert CountingRef.changed > 100  # the churn did penalise


def _update(batch_size: int, added=(), removed=()) -> BatchUpdate:
    return BatchUpdate(batch_size=batch_size, removed=list(removed), added=list(added), moved=[])


@pytest.mark.parametrize("window", [None, 7])
def test_placeholders_and_rewrites(window: int | None) -> None:
    """Async placeholders (a -1 suffix, filled later) and outputs the engine shrinks or
    rewrites: the core reads the same sequence as the reference."""
    cfg = EngineConfig(max_num_seqs=2, vocab_size=V)
    if window is not None:
        cfg = EngineConfig(max_num_seqs=2, vocab_size=V, max_dry_penalty_last_n=window)
    ours, ref = DryLogitsProcessor(cfg, "cpu", False), RefDryLogitsProcessor(cfg, "cpu", False)
    rng = random.Random(5)
    outs: list[list[int]] = [[], []]
    params = [
        SamplingParams(dry_multiplier=1.0, dry_allowed_length=2, max_tokens=None),
        SamplingParams(
            dry_multiplier=0.5,
            dry_allowed_length=1,
            dry_sequence_breakers=[[4, 0]],
            max_tokens=None,
        ),
    ]
    first = _update(2, added=[(i, params[i], [1, 2, 1], outs[i]) for i in range(2)])
    for proc in (ours, ref):
        proc.update_state(first)
    g = torch.Generator().manual_seed(0)
    changed = 0
    for step in range(300):
        for o in outs:
            if o and o[-1] == -1:
                o[-1] = rng.randrange(5)
            elif rng.random() < 0.1 and len(o) > 3:
                del o[-rng.randint(1, 3) :]
                if rng.random() < 0.5:
                    o.append(rng.randrange(5))
            else:
                o.append(-1 if rng.random() < 0.3 else rng.randrange(5))
        for proc in (ours, ref):
            proc.update_state(None)
        logits = torch.randn(2, V, generator=g)
        want = ref.apply(logits.clone())
        assert torch.equal(ours.apply(logits.clone()), want), f"step {step} {outs}"
        changed += int((want != logits).sum())
    assert changed > 50


def test_exponent_clamp_matches_llama_cpp() -> None:
    # base 40: max exponent floor(88.7228391 / ln 40) = 24; a long repetition is clamped there.
    seq = [1, 2] * 40
    got = ref_dry_penalties(seq, 1.0, 40.0, 2, [])
    assert got[1] == float(np.float32(40.0**24))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dry_multiplier", -1.0),
        ("dry_multiplier", math.nan),
        ("dry_multiplier", math.inf),
        ("dry_multiplier", "1"),
        ("dry_base", 0.5),
        ("dry_base", math.inf),
        ("dry_allowed_length", 0),
        ("dry_allowed_length", 1.5),
        ("dry_allowed_length", True),
        ("dry_penalty_last_n", -2),
        ("dry_penalty_last_n", 2.0),
        ("dry_sequence_breakers", [[]]),
        ("dry_sequence_breakers", [[-1]]),
        ("dry_sequence_breakers", "ab"),
        ("dry_sequence_breakers", [["a"]]),
    ],
)
def test_bad_fields_are_request_errors(field: str, value: Any) -> None:
    with pytest.raises(RequestError) as e:
        SamplingParams(**{field: value})
    assert e.value.field == field


class Raw:
    """Params as an engine might pass them, unchecked (the core checks them again)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dry_multiplier", -1.0),
        ("dry_base", 0.99),
        ("dry_allowed_length", 0),
        ("dry_penalty_last_n", -3),
        ("dry_penalty_last_n", 100_000),
        ("dry_sequence_breakers", [[]]),
        ("dry_sequence_breakers", [[V]]),
        ("dry_sequence_breakers", [[1]] * 600),
        ("dry_sequence_breakers", [[1] * 65]),
    ],
)
def test_the_core_refuses_bad_fields_naming_request_and_field(field: str, value: Any) -> None:
    cfg = EngineConfig(max_num_seqs=4, vocab_size=V)
    proc = DryLogitsProcessor(cfg, "cpu", False)
    good = Raw(dry_multiplier=1.0, dry_allowed_length=1)
    proc.update_state(_update(1, added=[(0, good, [1, 1], [])]))
    logits = torch.zeros(1, V)
    before = proc.apply(logits.clone())
    bad = Raw(**{"dry_multiplier": 1.0, field: value})
    with pytest.raises(ValueError) as e:
        proc.update_state(_update(2, added=[(1, bad, [1], [])], removed=[0]))
    msg = str(e.value)
    assert "index 1" in msg and f"{field!r}" in msg, msg
    # Nothing changed: the good request still penalises as before.
    proc.update_state(None)
    assert torch.equal(proc.apply(logits.clone()), before)
