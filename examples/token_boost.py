"""A custom processor that can change the argmax, built on two declared columns.

Each request may set ``extra_args={"boost_tokens": [ids...], "boost": b}``: every listed token's
logit is raised by ``b`` (a per-request, per-token nudge, e.g. toward a tool-call token). The
token list is a ``TokensColumn`` (at most 16 ids, padded with -1 on the device) and the amount a
``FloatColumn``; the core does every bit of batch bookkeeping.
"""

from __future__ import annotations

import torch

from logitsproc_rs import ColumnLogitsProcessor, FloatColumn, TokensColumn


def _args(params) -> dict:
    return getattr(params, "extra_args", None) or {}


class TokenBoostLogitsProcessor(ColumnLogitsProcessor):
    COLUMNS = (
        TokensColumn("boost_tokens", max_len=16, read=lambda p: _args(p).get("boost_tokens")),
        FloatColumn("boost", default=0.0, read=lambda p: _args(p).get("boost")),
    )

    def is_argmax_invariant(self) -> bool:
        return False

    def transform(self, logits: torch.Tensor, cols, num_active: int) -> torch.Tensor:
        if not num_active:
            return logits
        ids = cols["boost_tokens"].long()  # [rows, 16], -1 = padding
        listed = ids >= 0
        # Padding adds -0.0 to token 0, which leaves every value (even -0.0) unchanged.
        amount = torch.where(listed, cols["boost"], -0.0).to(logits.dtype)
        return logits.scatter_add_(1, ids.clamp(min=0), amount)
