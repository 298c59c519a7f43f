"""The device side of a pipeline's arena: typed views, staging copies, one upload per step.

The Rust core lays every exported buffer of a pipeline out in one arena (sections aligned to
``SECTION_ALIGN`` bytes). On the CPU torch reads the tables' own buffers (zero-copy DLPack
views) and nothing is copied. On a device there is one ``uint8`` arena tensor with a typed view
per section; after a step Rust copies what changed into a host *staging* copy of the arena and
this module uploads that byte span with one ``copy_(..., non_blocking=True)``.

The tables' own buffers are never read by a device copy, so Rust rewrites them at any time.
A staging copy is rewritten only after the copy out of it has finished: ``begin_step`` (called
from ``update_state``) waits on the events of the copies the last step issued; the step's own
upload uses staging copy 0 and any upload from ``apply`` (async placeholders, draft rows) uses
copies 1 to 3, which are free by then, so ``apply`` never waits on an event or on the host.
With ``is_pin_memory`` the staging copies are registered with CUDA once (page-aligned).

Every device operation runs under the processors' device (``torch.cuda.device``) and on its
current stream, and each event is recorded on that stream, so a pipeline on ``cuda:1`` works
while device 0 is current. When ``apply`` runs on another stream than the step did, that stream
waits on the device for the step's last operation (``order_current_stream``): never the host.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

from ._alloc import allocated

_CUDA_HOST_REGISTER_PORTABLE = 1
_DTYPES = {
    "float32": torch.float32,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
}
_APPLY_STAGING = (1, 2, 3)


def _unregister(ptrs: list[int], events: list[Any], _keepalive: list[Any]) -> None:
    # The last copies out of the registered memory must finish before it is unregistered
    # (and then freed by the Rust side once the views in `_keepalive` go).
    for ev in events:
        if ev is not None:
            ev.synchronize()
    cudart = torch.cuda.cudart()
    for p in ptrs:
        cudart.cudaHostUnregister(p)


class DeviceArena:
    """Typed device views of a core ``Pipeline``'s arena, and its uploads.

    ``emulate_device=True`` on the CPU keeps a separate arena tensor and uploads into it as on
    a GPU (tests use it to check that every change reaches the device copy).
    """

    def __init__(
        self, core: Any, device: torch.device, is_pin_memory: bool, emulate_device: bool = False
    ) -> None:
        self.core = core
        self.device = device
        self.zero_copy = device.type == "cpu" and not emulate_device
        self.sections: list[tuple[str, int, int, str, int]] = core.sections()
        self._events: list[Any] = [None, None, None, None]
        self._staging: list[torch.Tensor | None] = [None, None, None, None]
        self._apply_next = 0
        # The step's last device operation, and the stream it ran on (CUDA only).
        self._step_event: Any = None
        self._step_stream: Any = None
        self._pin = is_pin_memory and device.type == "cuda"
        self._pinned: list[int] = []
        self.views: list[torch.Tensor] = []
        if self.zero_copy:
            for i, (_name, _off, _bytes, _dtype, _len) in enumerate(self.sections):
                self.views.append(torch.from_dlpack(core.buffer(i)))
            return
        total = max(core.arena_bytes, 1)
        self.arena = allocated((total,), torch.uint8, device, "the arena", "arena")
        for _name, off, nbytes, dtype, length in self.sections:
            self.views.append(self.arena[off : off + nbytes].view(_DTYPES[dtype])[:length])
        # Packed uploads land in a scratch area and are scattered into the arena as int32 words
        # (every section is 256-byte aligned and holds 4- or 8-byte elements).
        self._scratch = allocated(
            (total,), torch.uint8, device, "the upload scratch area", "arena", fill=None
        )
        self._words = self.arena.view(torch.int32)
        if self._pin:
            fin = weakref.finalize(self, _unregister, self._pinned, self._events, self._staging)
            fin.atexit = False  # never after the CUDA context is gone
            # Register every staging copy now: cudaHostRegister is slow and may synchronise,
            # so it must never happen inside `apply`.
            for k in range(len(self._staging)):
                self._staging_tensor(k)
        # Start in step with the host: everything, once.
        span = core.stage(0, True)
        if span is not None:
            self._copy(0, span)
            self._events[0].synchronize() if self._events[0] is not None else None

    def _staging_tensor(self, k: int) -> torch.Tensor:
        t = self._staging[k]
        if t is None:
            view = self.core.staging(k)
            if self._pin:
                cudart = torch.cuda.cudart()
                rc = cudart.cudaHostRegister(
                    view.data_ptr, view.nbytes, _CUDA_HOST_REGISTER_PORTABLE
                )
                # On failure the copies registered before stay tracked in `_pinned`, so the
                # finaliser unregisters them: nothing is left half-registered.
                torch.cuda.check_error(rc)
                self._pinned.append(view.data_ptr)
            t = self._staging[k] = torch.from_dlpack(view)
        return t

    def _copy(self, k: int, upload: tuple[str, int, int]) -> None:
        """One host-to-device copy out of staging copy ``k`` (and, for a packed upload, one
        scatter on the device)."""
        kind, a, b = upload
        staging = self._staging_tensor(k)
        cuda = self.device.type == "cuda"
        with torch.cuda.device(self.device) if cuda else contextlib.nullcontext():
            if kind == "span":
                self.arena[a:b].copy_(staging[a:b], non_blocking=cuda)
            else:
                words, index_offset = a, b
                n = index_offset + 8 * words
                scratch = self._scratch
                scratch[:n].copy_(staging[:n], non_blocking=cuda)
                payload = scratch[: 4 * words].view(torch.int32)
                index = scratch[index_offset:n].view(torch.int64)
                self._words.index_copy_(0, index, payload)
            if cuda:
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(self.device))
                self._events[k] = ev

    def begin_step(self) -> None:
        """Before a step writes staging copies: wait until the last step's copies finished
        (a host wait, only ever in ``update_state``)."""
        for k, ev in enumerate(self._events):
            if ev is not None:
                ev.synchronize()
                self._events[k] = None
        self._apply_next = 0

    def upload_step(self) -> None:
        """The step's one upload (staging copy 0), or on the CPU, account for what changed."""
        if self.zero_copy:
            self.core.discard()
            return
        span = self.core.stage(0)
        if span is not None:
            self._copy(0, span)

    def upload_in_apply(self) -> None:
        """An extra upload from ``apply`` (async placeholders, draft rows): a staging copy that
        ``begin_step`` already freed, so nothing waits."""
        if self.zero_copy:
            self.core.discard()
            return
        if self._apply_next >= len(_APPLY_STAGING):
            # More extra uploads in one step than staging copies: wait for the oldest.
            self.begin_step()
        k = _APPLY_STAGING[self._apply_next]
        span = self.core.stage(k)
        if span is not None:
            self._apply_next += 1
            self._copy(k, span)

    def mark_step_done(self) -> None:
        """After a step's device work (upload, penalty counts): remember where it ran, so an
        ``apply`` on another stream can be ordered after it."""
        if self.device.type != "cuda":
            return
        stream = torch.cuda.current_stream(self.device)
        ev = self._step_event = torch.cuda.Event()
        ev.record(stream)
        self._step_stream = stream

    def order_current_stream(self) -> None:
        """Before ``apply``: if the current stream is not the one the step ran on, make it
        wait (on the device) for the step's work; the same stream is ordered already."""
        if self._step_event is None or torch.cuda.is_current_stream_capturing():
            # Under CUDA-graph capture the graph's replays are ordered by the engine (an event
            # recorded outside the capture cannot be waited on inside it).
            return
        stream = torch.cuda.current_stream(self.device)
        if stream != self._step_stream:
            stream.wait_event(self._step_event)

    @property
    def staging_in_use(self) -> list[int]:
        """Which staging copies exist (allocated, and pinned with ``is_pin_memory``)."""
        return [k for k, t in enumerate(self._staging) if t is not None]
