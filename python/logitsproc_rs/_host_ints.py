"""Token ids and slots from the engine, in the form the core reads fastest."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

import numpy as np
import torch

from .errors import RequestError

_INT64_MAX = 2**63 - 1


def _refuse(field: str, detail: str) -> RequestError:
    return RequestError.at(field, detail)


def host_ints(obj: Any, field: str = "sampled_token_ids") -> Any:
    """A host-side int sequence for the core, one entry per position (a token feed, its
    slots, a row map): a 1-D integer tensor or array as native int64 bytes (one copy); a list,
    tuple or other ordered iterable of ints (numpy integer scalars too) as it is, for the core
    to read item by item. A device tensor is copied to the host first, which waits for it:
    pass the sampler's output already on the host.

    Refused here, as a ``RequestError`` naming ``field``: tensors and arrays that are not 1-D
    (a 0-d scalar, a 2-D batch), not integers (floats, bools, complex, objects, strings), or
    unsigned values past int64 (they would wrap to negative ids, −1 among them); bytes-like
    objects and str; mappings and sets (no order: a dict would be read by its keys)."""
    if isinstance(obj, torch.Tensor):
        return _tensor_bytes(obj, field)
    if isinstance(obj, np.ndarray):
        return _array_bytes(obj, field)
    if isinstance(obj, (str, bytes, bytearray, memoryview, Mapping, Set)):
        return _refused_kind(obj, field)
    return obj


def _refused_kind(obj: Any, field: str) -> Any:
    raise _refuse(
        field,
        f"expected a sequence of ints (a list, or a 1-D integer tensor or array), got a "
        f"{type(obj).__name__}",
    )


def _tensor_bytes(t: torch.Tensor, field: str) -> bytes:
    if t.dim() != 1:
        raise _refuse(field, f"expected a 1-D integer tensor, got shape {list(t.shape)}")
    if t.dtype == torch.int64 and t.device.type == "cpu" and t.layout == torch.strided:
        return t.detach().numpy().tobytes()  # the common case: one copy, no torch op
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise _refuse(field, f"expected integer token ids or slots, got a {t.dtype} tensor")
    try:
        host = t.detach().to("cpu")
        if host.layout != torch.strided:
            host = host.to_dense()
        if host.dtype.is_signed or host.dtype == torch.uint8 or not host.numel():
            return host.to(torch.int64).contiguous().numpy().tobytes()
        # uint16 / uint32 / uint64: past int64 is no token id and no slot (it would wrap).
        wide = host.numpy().astype(np.uint64)
    except Exception as e:  # a meta tensor, an exotic dtype or layout: not ints we can read
        raise _refuse(field, f"cannot read a {t.dtype} tensor on {t.device}: {e}") from e
    return _unsigned_bytes(wide, field)


def _array_bytes(a: np.ndarray, field: str) -> bytes:
    if a.ndim != 1:
        raise _refuse(field, f"expected a 1-D integer array, got shape {list(a.shape)}")
    if a.dtype.kind not in "iu":
        raise _refuse(field, f"expected integer token ids or slots, got a {a.dtype} array")
    if isinstance(a, np.ma.MaskedArray):
        raise _refuse(field, "expected a plain array, got a masked array")
    if a.dtype.kind == "u" and a.dtype.itemsize == 8:
        return _unsigned_bytes(np.asarray(a), field)
    return np.ascontiguousarray(a, dtype=np.int64).tobytes()


def _unsigned_bytes(a: np.ndarray, field: str) -> bytes:
    past = np.flatnonzero(a > np.uint64(_INT64_MAX))
    if past.size:
        pos = int(past[0])
        detail = f"position {pos}: {int(a[pos])} is outside the int64 range"
        raise RequestError.located(pos, field, detail)
    return np.ascontiguousarray(a, dtype=np.int64).tobytes()
