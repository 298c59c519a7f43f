"""Host buffers owned by Rust, seen by torch on the logits' device.

On the CPU the torch tensors *are* the Rust buffers (zero-copy DLPack views). On CUDA each
buffer gets a device twin; ``upload(n)`` copies the first ``n`` elements with
``non_blocking=True``. With ``is_pin_memory`` the Rust buffers are registered with CUDA once
(page-aligned, whole pages), which makes those copies truly asynchronous; so before Rust
rewrites a buffer, ``before_host_write`` waits for the event recorded after the last copy out
of it. That wait happens in ``update_state``, never in ``apply``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

_CUDA_HOST_REGISTER_PORTABLE = 1


def _unregister(ptrs: list[int], _keepalive: list[torch.Tensor]) -> None:
    # Runs before the host tensors (which own the Rust memory) are released.
    cudart = torch.cuda.cudart()
    for p in ptrs:
        cudart.cudaHostUnregister(p)


class DeviceMirror:
    """Device views of a group of Rust host buffers."""

    def __init__(self, views: Sequence[Any], device: torch.device | str, is_pin_memory: bool):
        self.device = torch.device(device)
        self.host: list[torch.Tensor] = [torch.from_dlpack(v) for v in views]
        self.on_cpu = self.device.type == "cpu"
        self.pinned = False
        self._event: Any = None
        if self.on_cpu:
            self.dev = self.host
            return
        if is_pin_memory and self.device.type == "cuda":
            cudart = torch.cuda.cudart()
            ptrs = []
            for v in views:
                rc = cudart.cudaHostRegister(v.data_ptr, v.nbytes, _CUDA_HOST_REGISTER_PORTABLE)
                torch.cuda.check_error(rc)
                ptrs.append(v.data_ptr)
            fin = weakref.finalize(self, _unregister, ptrs, self.host)
            fin.atexit = False  # never after the CUDA context is gone
            self.pinned = True
        # Start in step with the host (a blocking copy, once).
        self.dev = [h.to(self.device) for h in self.host]

    def before_host_write(self) -> None:
        """Wait until the last asynchronous copy out of the host buffers has finished."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None

    def upload(self, n: int) -> None:
        """Copy the first ``n`` elements of every buffer to the device (no-op on CPU)."""
        if self.on_cpu or n == 0:
            return
        for h, d in zip(self.host, self.dev, strict=True):
            d[:n].copy_(h[:n], non_blocking=True)
        if self.pinned:
            self._event = torch.cuda.Event()
            self._event.record()


class TripleViews:
    """Device views of three Rust triple buffers (rows, cols, vals).

    Rust pads the valid triples to a power-of-two length with no-op entries, so the views are
    cached per length: a step that rebuilt the triples costs a dict lookup here, not three
    torch slices.
    """

    def __init__(
        self, views: Sequence[Any], device: torch.device | str, is_pin_memory: bool
    ) -> None:
        self.mirror = DeviceMirror(views, device, is_pin_memory)
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.current: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def refresh(self, n: int) -> None:
        """Call after Rust rewrote the triples (padded length ``n``): upload them and select
        the views to apply."""
        if n == 0:
            self.current = None
            return
        self.mirror.upload(n)
        views = self._cache.get(n)
        if views is None:
            rows, cols, vals = (t[:n] for t in self.mirror.dev)
            views = self._cache[n] = (rows, cols, vals)
        self.current = views
