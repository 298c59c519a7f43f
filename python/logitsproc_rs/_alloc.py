"""The one way a table or processor allocates a tensor it keeps (at construction, or at first
use): a pipeline's device arena and its upload scratch area, the penalties' count matrix, the
allowed ids' bitmask scratch.

An allocation torch refuses (its ``RuntimeError``, or on a GPU its ``OutOfMemoryError``, a
``RuntimeError`` too) is an ``AllocationError`` (a ``MemoryError``) that names what the tensor
was for and the size asked for, as the core's own refused allocations are. Temporaries an
``apply`` makes and drops are ordinary torch ops, and fail as torch fails.
"""

from __future__ import annotations

import contextlib
import math

import torch

from .errors import AllocationError


def allocated(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    what: str,
    field: str,
    fill: int | None = 0,
) -> torch.Tensor:
    """A new ``shape`` tensor of ``dtype`` on ``device`` (under that device on CUDA), every
    element ``fill`` (``None``: left uninitialised). Refused, it is an ``AllocationError``
    naming ``what`` (``"the penalties' count matrix"``), the shape, dtype and bytes asked for
    and the device; ``field``: what it was for (a table's name, ``"arena"``)."""
    try:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            if fill is None:
                return torch.empty(shape, dtype=dtype, device=device)
            if fill == 0:
                return torch.zeros(shape, dtype=dtype, device=device)
            return torch.full(shape, fill, dtype=dtype, device=device)
    except (RuntimeError, MemoryError) as e:
        nbytes = math.prod(shape) * dtype.itemsize
        raise AllocationError.refused(what, shape, dtype, nbytes, device, e, field=field) from e
