"""The demo's agreement check: ours vs the reference, exact, MinP float ties aside.

Both samplers run on the same logits with identically seeded generators, so every row must
come out with the same processed logits and the same token. The one allowed difference:
our MinP keeps a token iff logit >= max + ln(min_p) (no softmax); the reference keeps it iff
softmax p >= min_p * p_max. They differ only for tokens within float rounding of that
threshold: a row whose processed logits differ only by one side masking a value the other
kept, with at least one such value within ``TIE_TOL`` * max(1, |max|) of max + ln(min_p), is a
documented tie (the same tolerance as tests/test_differential.py). Other differences in such a
row are knock-on effects of the tie through top-k / top-p.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..params import SamplingType
from ..reference import RefSamplerOutput
from ..sampler import SamplerOutput
from ..simulate import Request

TIE_TOL = 1e-5


def is_min_p_tie(a: torch.Tensor, b: torch.Tensor, min_p: float) -> bool:
    """Whether rows ``a`` (ours) and ``b`` (reference) differ only through a MinP float tie
    (see ``TIE_TOL``). Both are processed (post-temperature, masked) logits of one row."""
    if min_p <= 0.0:
        return False
    a, b = a.double().cpu(), b.double().cpu()
    diff = (a != b) & ~(a.isnan() & b.isnan())
    av, bv = a[diff], b[diff]
    if av.numel() == 0:
        return False
    neg_inf = -math.inf
    one_sided = ((av == neg_inf) & bv.isfinite()) | ((bv == neg_inf) & av.isfinite())
    if not bool(one_sided.all()):
        return False
    kept = torch.where(av.isfinite(), av, bv)
    row_max = float(torch.maximum(a.max(), b.max()))  # the top token survives on both sides
    threshold = row_max + math.log(float(torch.tensor(min_p, dtype=torch.float32)))
    near = (kept - threshold).abs() <= TIE_TOL * max(1.0, abs(row_max))
    return bool(near.any())


@dataclasses.dataclass
class Agreement:
    """Rows compared so far, and how they agreed."""

    checked_steps: int = 0
    checked_rows: int = 0
    rows_equal: int = 0
    tie_rows: int = 0  # rows that differ only through a MinP float tie
    tie_token_diffs: int = 0  # of those, rows where the tie changed the sampled token

    @property
    def mismatches(self) -> int:
        return self.checked_rows - self.rows_equal - self.tie_rows

    def compare(
        self,
        step: int,
        rows: list[Request],
        out: SamplerOutput,
        out_ref: RefSamplerOutput,
    ) -> str | None:
        """Count one step's agreement; return a message on a real mismatch (None when all
        rows agree or differ only through documented MinP ties)."""
        a, b = out.logits, out_ref.logits
        tokens = out.sampled_token_ids.tolist()
        ref_tokens = out_ref.sampled_token_ids.tolist()
        self.checked_steps += 1
        self.checked_rows += len(rows)
        same = (a == b) | (a.isnan() & b.isnan())
        row_ok = same.all(dim=-1).tolist()
        for i, r in enumerate(rows):
            if row_ok[i] and tokens[i] == ref_tokens[i]:
                self.rows_equal += 1
                continue
            p = r.params
            if p.sampling_type != SamplingType.GREEDY and is_min_p_tie(a[i], b[i], p.min_p):
                self.tie_rows += 1
                self.tie_token_diffs += tokens[i] != ref_tokens[i]
                continue
            ndiff = int((~same[i]).sum())
            return (
                f"MISMATCH at step {step}, row {i} (request {r.req_id}): ours sampled "
                f"{tokens[i]}, the reference {ref_tokens[i]}; processed logits differ at "
                f"{ndiff} positions\n  params: {p}\n  output so far "
                f"({len(r.output_token_ids)} tokens): {r.output_token_ids[-16:]}"
            )
        return None
