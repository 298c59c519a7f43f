"""What each rank of a distributed engine's processors saw, step by step, for the tensor- and
data-parallel scenarios (``driver.py``'s ``tp2`` and ``dp2_served``). Every TP rank builds its
own processors and samples the whole batch, and only rank 0's tokens are kept: ranks whose
processors saw different batches (or made different logits of the same batch) would
desynchronize silently. Each DP rank is an engine of its own, serving its share of requests.

Two V1 logits processors, loaded around ours: ``BatchDigest`` first (argmax-changing, so it sees
each batch change and the logits before ours), ``LogitsDigest`` last (argmax-invariant, so it
sees the logits after every processor of ours, the argmax-invariant ones included). Each writes
one JSON line per call to ``$LOGITSPROC_DIGEST_DIR/dp<d>-tp<t>.jsonl`` (its ranks): the call,
the batch size and a SHA-1 of what it got. Neither changes the logits.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

DIR_ENV = "LOGITSPROC_DIGEST_DIR"


def _rank_name(vllm_config: Any) -> str:
    """``dp<d>-tp<t>``: the engine's data-parallel rank (its ``data_parallel_index``: vLLM 0.32
    runs each DP rank of a dense model as an independent engine of rank 0), the worker's
    tensor-parallel rank."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    parallel = vllm_config.parallel_config
    dp = getattr(parallel, "data_parallel_index", parallel.data_parallel_rank)
    return f"dp{dp}-tp{get_tensor_model_parallel_rank()}"


def _sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


def _batch(update: BatchUpdate) -> str:
    """The change as the processors read it: removed slots, added requests (slot, prompt, the
    extra args, the length of the output so far), moves."""
    added = [
        (i, list(prompt or ()), repr(sorted((params.extra_args or {}).items())), len(out))
        for i, params, prompt, out in update.added
    ]
    body = [update.batch_size, sorted(update.removed), added, [list(m) for m in update.moved]]
    return _sha(json.dumps(body, default=repr).encode())


class _Digest(LogitsProcessor):
    call = "?"

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.path = os.path.join(os.environ[DIR_ENV], f"{_rank_name(vllm_config)}.jsonl")
        self.batch = "none"

    def _write(self, **line: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"call": self.call, **line}) + "\n")

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            self.batch = _batch(batch_update)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        host = logits.detach().to("cpu", torch.float32).contiguous()
        self._write(rows=host.shape[0], batch=self.batch, logits=_sha(host.numpy().tobytes()))
        self.batch = "none"
        return logits


class BatchDigest(_Digest):
    call = "before"

    def is_argmax_invariant(self) -> bool:
        return False


class LogitsDigest(_Digest):
    call = "after"

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass


def read(directory: str) -> dict[str, list[dict]]:
    """Each rank's lines, by rank file name."""
    out: dict[str, list[dict]] = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            out[name.removesuffix(".jsonl")] = [json.loads(line) for line in f]
    return out
