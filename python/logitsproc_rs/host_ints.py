"""Token ids and slots from the engine, in the form the core reads fastest."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def host_ints(obj: Any) -> Any:
    """A host-side int sequence for the core: tensors and arrays as native int64 bytes (one
    copy), other sequences as they are. A device tensor is copied to the host first, which
    waits for it: pass the sampler's output already on the host."""
    if isinstance(obj, torch.Tensor):
        if obj.dtype == torch.int64 and obj.device.type == "cpu" and not obj.requires_grad:
            return obj.numpy().tobytes()  # the common case: one copy, no torch op
        if obj.dtype.is_floating_point or obj.dtype.is_complex or obj.dtype == torch.bool:
            raise ValueError(f"expected integer token ids or slots, got a {obj.dtype} tensor")
        return obj.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "iu":
            raise ValueError(f"expected integer token ids or slots, got a {obj.dtype} array")
        return np.ascontiguousarray(obj, dtype=np.int64).tobytes()
    return obj
