"""Processors written the way vLLM 0.25.1's documentation writes custom processors.

Only the import block between the two marker lines names a library. As it stands the classes
run in logitsproc_rs; with vLLM's names instead

    from vllm.v1.sample.logits_processor import (AdapterLogitsProcessor, BatchUpdate,
                                                 LogitsProcessor)
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

the same classes run inside vLLM (``tests/test_vllm_v1.py`` runs both forms, and loads the
vLLM form into our ``build_logitsprocs`` too).

- ``TargetTokenLogitsProcessor``: the documentation's batch-level example. A request that sets
  ``extra_args={"target_token": t}`` keeps only token ``t``; its state is a dict kept by
  ``process_dict_updates``.
- ``TargetTokenAdapter``: the same rule as a per-request function wrapped by
  ``AdapterLogitsProcessor``.
- ``BanPromptAdapter``: a per-request function of three arguments (prompt ids, output ids,
  logits row): ``extra_args={"ban_prompt": True}`` forbids the prompt's tokens and the last
  generated one.
"""

from __future__ import annotations

from typing import Any

import torch

# --- imports ---
from logitsproc_rs import AdapterLogitsProcessor, BatchUpdate, LogitsProcessor, process_dict_updates

# --- end imports ---


def _extra(params: Any) -> dict:
    return params.extra_args or {}


class TargetTokenLogitsProcessor(LogitsProcessor):
    """Rows whose request names a ``target_token`` keep only that token's logit."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.targets: dict[int, int] = {}  # batch index -> target token

    def is_argmax_invariant(self) -> bool:
        return False  # it picks the winner

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(
            self.targets, batch_update, lambda params, _, __: _extra(params).get("target_token")
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.targets:
            return logits
        rows = torch.tensor(list(self.targets), dtype=torch.long, device=logits.device)
        cols = torch.tensor(list(self.targets.values()), dtype=torch.long, device=logits.device)
        kept = logits[rows, cols].clone()
        logits[rows] = float("-inf")
        logits[rows, cols] = kept
        return logits


class _KeepOnly:
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(logits, float("-inf"))  # a new row: the adapter copies it in
        out[self.token] = logits[self.token]
        return out


class TargetTokenAdapter(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any) -> Any:
        token = _extra(params).get("target_token")
        return None if token is None else _KeepOnly(token)


def _ban_prompt(prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    banned = list(prompt_ids) + list(output_ids[-1:])
    if banned:
        logits[banned] = float("-inf")  # in place: the adapter keeps the row as it is
    return logits


class BanPromptAdapter(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any) -> Any:
        return _ban_prompt if _extra(params).get("ban_prompt") else None
