"""Checks shared by the built-in processors' ``apply``."""

from __future__ import annotations

from typing import Any

import torch

from .._transfer import TripleViews


def check_logits(name: str, logits: torch.Tensor, rows: int, vocab_size: int | None) -> None:
    """Raise ``ValueError`` unless ``logits`` is ``[rows, vocab_size]`` (host-side, no sync)."""
    if (
        logits.dim() != 2
        or logits.shape[0] != rows
        or (vocab_size is not None and logits.shape[1] != vocab_size)
    ):
        want = f"[{rows}, {vocab_size if vocab_size is not None else 'V'}]"
        raise ValueError(
            f"{name}.apply: logits of shape {list(logits.shape)} do not match the batch: "
            f"expected {want} (batch_size from the last BatchUpdate, vocab_size from the config)"
        )


def host_kernel_ok(logits: torch.Tensor) -> bool:
    """Whether Rust may process ``logits`` in place on the host: float32 on the CPU, rows of
    contiguous elements that do not overlap (the ``unsafe_apply_cpu`` contract)."""
    return (
        logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(1) == 1
        and logits.stride(0) >= logits.shape[1]
        and not logits.requires_grad
    )


class DraftRowMask:
    """Speculative decoding's draft-row masks for a state with ``spec_decode`` and
    ``spec_rows/cols/vals`` (MinTokens, bad words): built by Rust per call, written as −inf.
    The device buffers are made on first use."""

    def __init__(self, name: str, state: Any, vocab_size: int, device: Any, pin: bool) -> None:
        self._name, self._state, self._vocab_size = name, state, vocab_size
        self._device, self._pin = device, pin
        self._views: Any = None

    def apply(self, logits: torch.Tensor, *spec_args: Any) -> torch.Tensor:
        """``spec_args`` go to the state's ``spec_decode`` (the draft counts, ...)."""

        if self._views is None:
            s = self._state
            self._views = TripleViews(
                [s.spec_rows(), s.spec_cols(), s.spec_vals()], self._device, self._pin
            )
        self._views.mirror.before_host_write()
        rows, n = self._state.spec_decode(*spec_args)
        check_logits(f"{self._name}.apply_with_spec_decode", logits, rows, self._vocab_size)
        self._views.refresh(n)
        if self._views.current is None:
            return logits
        rows_t, cols, vals = self._views.current
        return logits.index_put_((rows_t, cols), vals)
