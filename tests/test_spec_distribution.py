"""Speculative decoding preserves the distribution: a statistical check of the draft rows.

A toy target model (a fixed random logits table indexed by the last token, vocab ``V``) and a
toy draft model (a different table) generate sequences through the stable-slot pipeline with
our history-reading processors on (bad words that ban a token after another, MinTokens masking
EOS, no-repeat-ngram, DRY, or the thinking budget), two ways:

* **plain**: one row per slot and step, the next token sampled from the processed target row;
* **speculative**: each step every slot drafts ``K`` tokens from the draft model, owns ``K + 1``
  rows (``local_pos`` 0..K, ``input_ids`` the last token then the drafts), the target logits of
  row ``j`` are processed over the committed history + ``d_0 .. d_{j-1}``, and standard
  rejection sampling (Leviathan et al., vLLM's rejection sampler) commits a prefix of the
  drafts plus one token: draft ``d_j`` accepted with probability ``min(1, p_j(d_j) / q_j(d_j))``,
  on the first rejection a token from ``norm(max(0, p_j - q_j))``, after ``K`` acceptances the
  bonus token from ``p_K``. The committed tokens go back in with the next step's feed.

The first ``L`` generated tokens of both must have one distribution: a two-sample chi-square
test of homogeneity over the ``V^L`` sequences (cells with a pooled count under ``MIN_CELL``
merged into one) stays under the ``1 - ALPHA`` quantile of its chi-square law (Wilson-Hilferty).
With the drafts ignored (``apply`` without ``local_pos``/``input_ids``: every row of a slot
sees only the committed history) the same test must reject (the check has teeth). Seeded
torch generators: deterministic. Thousands of sequences per method: ``B`` slots at once.

The repetition/frequency/presence penalties are on in every scenario (``PENALTIES``), and
``test_penalties_per_position`` runs the "dry" scenario with them alone on top.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from logitsproc_rs import EngineConfig, SamplingParams, build_logitsprocs
from logitsproc_rs.builtin import (
    DryLogitsProcessor,
    MinPLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
)

PENALTIES = True  # every scenario also has repetition / frequency / presence penalties

V = 10  # vocab: 0..6 words, 7 think start, 8 think end, 9 EOS
START, END, EOS = 7, 8, 9
K = 3  # drafts per slot and step
L = 3  # the generated prefix compared
B = 256  # slots (independent sequences) at once
ROUNDS = 40  # B sequences per round: N = B * ROUNDS = 10,240 sequences per method
ALPHA = 1e-3  # the homogeneity test's level
MIN_CELL = 10  # cells with fewer pooled sequences go into one "other" cell


@dataclass(frozen=True)
class Scenario:
    name: str
    prompt: tuple[int, ...]
    params: dict[str, Any]


SCENARIOS = [
    Scenario(
        "masks",
        (3, 1),
        dict(
            bad_words_token_ids=[[1, 2], [2, 1], [0, 3, 4]],  # 2 after 1, 1 after 2, 4 after 0 3
            min_tokens=2,
            stop_token_ids=[EOS],  # masked for the first 2 tokens
            no_repeat_ngram_size=2,  # no bigram of prompt + output twice
            dry_multiplier=1.5,
            dry_allowed_length=1,
            dry_base=2.0,
        ),
    ),
    # One soft processor alone: no sequence becomes impossible, the law only shifts.
    Scenario("dry", (3, 1), dict(dry_multiplier=1.0, dry_allowed_length=1, dry_base=2.0)),
    Scenario("min_tokens", (3, 1), dict(min_tokens=2, stop_token_ids=[EOS, 2])),
    Scenario(
        "thinking",
        (5, START),
        dict(
            thinking_token_budget=1,  # in thinking from the prompt: the 2nd token is forced END
            bad_words_token_ids=[[END, 0], [4, 5]],  # 0 right after the end, 5 after 4
            min_tokens=3,
            stop_token_ids=[EOS],
        ),
    ),
]


def penalties() -> dict[str, Any]:
    return dict(repetition_penalty=1.8, frequency_penalty=0.7, presence_penalty=0.5)


class Model:
    """The target (logits table) and the draft (probability table), by last token."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.target = torch.randn(V, V, generator=g) * 1.5
        # Close enough to the target that most drafts are accepted, different enough that
        # rejections (and the residual) happen often.
        noise = torch.randn(V, V, generator=g)
        self.draft = torch.softmax(self.target + noise, dim=-1)


class Generator:
    """``B`` slots of one pipeline, each generating ``L`` tokens per round."""

    def __init__(
        self, scenario: Scenario, model: Model, seed: int, penalties_on: bool = PENALTIES
    ) -> None:
        cfg = EngineConfig(
            max_num_seqs=B,
            vocab_size=V,
            reasoning_start_token_ids=[START],
            reasoning_end_token_ids=[END],
        )
        opt_in = [DryLogitsProcessor, NoRepeatNGramLogitsProcessor]
        procs = build_logitsprocs(
            cfg, "cpu", False, custom_logitsprocs=opt_in, stable_slots=True, token_feed=True,
            max_rows=B * (K + 1),
        )  # fmt: skip
        self.pipe = procs.pipeline
        self.procs = [p for p in self.pipe._views if not isinstance(p, MinPLogitsProcessor)]
        extra = penalties() if penalties_on else {}
        self.params = SamplingParams(temperature=1.0, **scenario.params, **extra)
        self.prompt = list(scenario.prompt)
        self.model = model
        self.gen = torch.Generator().manual_seed(seed)
        self.slots = torch.arange(B)
        self.steps = 0  # speculative steps (slot-steps: B per step)
        self.accepted = 0  # drafts accepted over them

    def sample(self, mode: str) -> torch.Tensor:
        """``[B * ROUNDS, L]`` generated prefixes; mode: plain, spec or spec-blind."""
        out = []
        for _ in range(ROUNDS):
            for s in range(B):
                self.pipe.add_request(s, self.params, self.prompt, [])
            out.append(self.round(mode))
        return torch.cat(out)

    def round(self, mode: str) -> torch.Tensor:
        done: list[list[int]] = [[] for _ in range(B)]
        last = torch.full((B,), self.prompt[-1])
        feed: tuple[list[int], list[int]] | None = None
        while min(len(d) for d in done) < L:
            tok, sl = feed if feed else (None, None)
            if mode == "plain":
                x = self.model.target[last]
                y = self.pipe.apply(x, self.slots.tolist(), self.procs, tok, sl)
                nxt = torch.multinomial(torch.softmax(y, -1), 1, generator=self.gen)
                committed = [[t] for t in nxt[:, 0].tolist()]
            else:
                committed = self.spec_step(last, tok, sl, blind=mode == "spec-blind")
            for s, c in enumerate(committed):
                done[s] += c
            last = torch.tensor([c[-1] for c in committed])
            feed = (
                [t for c in committed for t in c],
                [s for s, c in enumerate(committed) for _ in c],
            )
        return torch.tensor([d[:L] for d in done])

    def exact(self) -> torch.Tensor:
        """The exact law of plain decoding's first ``L`` tokens, ``[V] * L``: every prefix of
        fewer than ``L`` tokens is one request (the prefix as its output), one row each."""
        prefixes = [list(t) for n in range(L) for t in itertools.product(range(V), repeat=n)]
        assert len(prefixes) <= B
        for s, pre in enumerate(prefixes):
            self.pipe.add_request(s, self.params, self.prompt, list(pre))
        last = [pre[-1] if pre else self.prompt[-1] for pre in prefixes]
        rows = list(range(len(prefixes)))
        y = self.pipe.apply(self.model.target[last], rows, self.procs)
        cond = {tuple(pre): torch.softmax(y[s], -1).double() for s, pre in enumerate(prefixes)}
        law = torch.ones([])
        for n in range(L):
            nxt = torch.stack([cond[t] for t in itertools.product(range(V), repeat=n)])
            law = law.reshape(-1, 1) * nxt.reshape(law.numel(), V)
        return law.reshape([V] * L)

    def spec_step(self, last: torch.Tensor, tok: Any, sl: Any, blind: bool) -> list[list[int]]:
        """One speculative step of every slot: ``K`` drafts, ``K + 1`` target rows, rejection
        sampling. Returns each slot's committed tokens (accepted drafts + one)."""
        g, q_tab = self.gen, self.model.draft
        drafts, qs, cur = [], [], last
        for _ in range(K):
            q = q_tab[cur]
            cur = torch.multinomial(q, 1, generator=g)[:, 0]
            drafts.append(cur)
            qs.append(q)
        d = torch.stack(drafts, 1)  # [B, K]
        q = torch.stack(qs, 1)  # [B, K, V]
        inputs = torch.cat([last[:, None], d], 1)  # [B, K + 1]: row j is fed d_{j-1}
        row_map = self.slots.repeat_interleave(K + 1).tolist()
        x = self.model.target[inputs.reshape(-1)]
        if blind:
            y = self.pipe.apply(x, row_map, self.procs, tok, sl)
        else:
            pos = list(range(K + 1)) * B
            ids = inputs.reshape(-1).tolist()
            y = self.pipe.apply(x, row_map, self.procs, tok, sl, local_pos=pos, input_ids=ids)
        p = torch.softmax(y.reshape(B, K + 1, V), -1)
        pd = p[:, :K].gather(2, d[:, :, None])[:, :, 0]
        qd = q.gather(2, d[:, :, None])[:, :, 0]
        u = torch.rand(B, K, generator=g)
        accept = u < (pd / qd).clamp(max=1.0)
        n = accept.to(torch.int64).cumprod(1).sum(1)  # leading acceptances
        resid = (p[:, :K] - q).clamp(min=0.0)
        resid = torch.cat([resid, p[:, K:]], 1)  # after K acceptances: the bonus row
        r = resid[torch.arange(B), n]
        empty = r.sum(-1) <= 0  # p == q on that row: the residual is p itself
        r[empty] = p[torch.arange(B), n][empty]
        last_tok = torch.multinomial(r, 1, generator=g)[:, 0]
        self.steps += B
        self.accepted += int(n.sum())
        return [[*d[s, : n[s]].tolist(), int(last_tok[s])] for s in range(B)]


def chi2_quantile(df: int, alpha: float) -> float:
    """The ``1 - alpha`` quantile of chi-square(df), Wilson-Hilferty."""
    z = _normal_quantile(1 - alpha)
    a = 2 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def _normal_quantile(p: float) -> float:
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def homogeneity(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int, float]:
    """Two-sample chi-square over the sequences (equal sample sizes): the statistic, its
    degrees of freedom, and the total variation distance of the two empirical laws."""
    assert a.shape == b.shape
    code = V ** torch.arange(L - 1, -1, -1)
    ca = torch.bincount((a * code).sum(1), minlength=V**L).double()
    cb = torch.bincount((b * code).sum(1), minlength=V**L).double()
    tv = 0.5 * (ca - cb).abs().sum().item() / a.shape[0]
    big = (ca + cb) >= MIN_CELL
    ca_, cb_ = ca[big], cb[big]
    rest_a, rest_b = ca[~big].sum(), cb[~big].sum()
    if rest_a + rest_b > 0:
        ca_ = torch.cat([ca_, rest_a[None]])
        cb_ = torch.cat([cb_, rest_b[None]])
    stat = ((ca_ - cb_) ** 2 / (ca_ + cb_)).sum().item()
    return stat, len(ca_) - 1, tv


def goodness_of_fit(a: torch.Tensor, law: torch.Tensor) -> tuple[float, int, float, int]:
    """Chi-square of the sample against the exact law (cells expecting fewer than
    ``MIN_CELL`` merged into one): the statistic (infinite if a sequence of probability 0
    was generated), its degrees of freedom, the TV distance, and the number of sequences of
    probability 0."""
    n = a.shape[0]
    code = V ** torch.arange(L - 1, -1, -1)
    count = torch.bincount((a * code).sum(1), minlength=V**L).double()
    expect = law.reshape(-1) * n
    tv = 0.5 * (count - expect).abs().sum().item() / n
    impossible = int(count[expect == 0].sum())
    big = expect >= MIN_CELL
    c, e = count[big], expect[big]
    if (~big).any() and expect[~big].sum() > 0:
        c = torch.cat([c, count[~big].sum()[None]])
        e = torch.cat([e, expect[~big].sum()[None]])
    stat = ((c - e) ** 2 / e).sum().item() if not impossible else math.inf
    return stat, len(c) - 1, tv, impossible


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_speculation_preserves_the_distribution(scenario: Scenario) -> None:
    check(scenario, PENALTIES)


def test_penalties_per_position() -> None:
    check(next(s for s in SCENARIOS if s.name == "dry"), True)


def check(scenario: Scenario, penalties_on: bool) -> None:
    model = Model(seed=1)
    plain = Generator(scenario, model, 2, penalties_on).sample("plain")
    spec_gen = Generator(scenario, model, 3, penalties_on)
    spec = spec_gen.sample("spec")
    blind = Generator(scenario, model, 4, penalties_on).sample("spec-blind")
    law = Generator(scenario, model, 5, penalties_on).exact()
    # Speculation did speculate: drafts were accepted and rejected (K = 3 per slot-step).
    mean_accepted = spec_gen.accepted / spec_gen.steps
    assert 0.5 < mean_accepted < K - 0.5, mean_accepted
    # Each sample against the exact law of plain decoding.
    fits = {m: goodness_of_fit(x, law) for m, x in (("plain", plain), ("spec", spec),
                                                    ("drafts ignored", blind))}  # fmt: skip
    for m, (st, df, tv, zero) in fits.items():
        print(f"{scenario.name}: {m} vs exact: chi2 {st:.1f} (df {df}, bound "
              f"{chi2_quantile(df, ALPHA):.1f}), TV {tv:.4f}, {zero} of probability 0")  # fmt: skip
    print(f"{scenario.name}: {mean_accepted:.2f} drafts accepted per slot-step (K = {K})")
    stat, df, tv = homogeneity(plain, spec)
    bound = chi2_quantile(df, ALPHA)
    stat_b, df_b, tv_b = homogeneity(plain, blind)
    bound_b = chi2_quantile(df_b, ALPHA)
    print(
        f"{scenario.name}: N = {len(plain)} per method; plain vs spec chi2 {stat:.1f} "
        f"(df {df}, bound {bound:.1f}), TV {tv:.4f}; plain vs drafts ignored chi2 {stat_b:.1f} "
        f"(df {df_b}, bound {bound_b:.1f}), TV {tv_b:.4f}"
    )
    assert stat <= bound, (stat, df, bound)
    assert stat_b > bound_b, (stat_b, df_b, bound_b)
    for m in ("plain", "spec"):
        st, df, _, zero = fits[m]
        assert zero == 0 and st <= chi2_quantile(df, ALPHA), (m, st, df, zero)
    st, df, _, _ = fits["drafts ignored"]
    assert st > chi2_quantile(df, ALPHA), (st, df)
