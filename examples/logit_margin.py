"""An argmax-invariant custom processor built on a declared column.

Each request may set ``extra_args={"logit_margin": m}``: tokens whose logit is more than ``m``
below the row's best are dropped (a logit-space cousin of MinP with a fixed margin). The best
token always survives, so the processor is argmax-invariant and the sampler runs it only for
randomly sampled rows. The core keeps the margin per slot through every add, removal, condense
and swap; this class never sees a batch update.
"""

from __future__ import annotations

import torch

from logitsproc_rs import ColumnLogitsProcessor, FloatColumn


def _margin(params) -> float | None:
    return (getattr(params, "extra_args", None) or {}).get("logit_margin")


class LogitMarginLogitsProcessor(ColumnLogitsProcessor):
    # 0 means "off": no request drops anything unless it asks.
    COLUMNS = (FloatColumn("logit_margin", default=0.0, read=_margin),)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        m = _margin(sampling_params)
        if m is not None and not (isinstance(m, (int, float)) and m >= 0):
            raise ValueError(f"extra_args['logit_margin'] must be a number >= 0, got {m!r}")

    def is_argmax_invariant(self) -> bool:
        return True

    def transform(self, logits: torch.Tensor, cols, num_active: int) -> torch.Tensor:
        if not num_active:  # a host-side count: no device work, no sync
            return logits
        margin = cols["logit_margin"]  # [rows, 1], 0 where unset
        threshold = logits.amax(dim=-1, keepdim=True) - margin
        drop = (logits < threshold) & (margin > 0)
        return logits.masked_fill_(drop, float("-inf"))
