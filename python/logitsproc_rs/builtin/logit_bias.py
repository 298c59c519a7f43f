"""LogitBias: add per-request ``{token: bias}`` to the logits."""

from __future__ import annotations

from ..views import Stage
from ._common import TripleView


class LogitBiasLogitsProcessor(TripleView):
    """Not argmax-invariant: a bias can change the top token."""

    TABLES = ("logit_bias",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.BUILTIN
    REFERENCE = "logitsproc_rs.reference:RefLogitBiasLogitsProcessor"
