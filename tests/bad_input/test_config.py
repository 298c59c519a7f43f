"""Bad configs and capacities: config mappings with unknown fields, duck-typed configs without the
fields or with bad values, reasoning ids outside the vocabulary, and capacities that cannot be
allocated or overflow (an ordinary exception, in a child process where the process could die:
forked from the tests' fork server, ``tests/_forkserver.py``, or a fresh interpreter where the
limit is absolute; never an abort or a panic)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _forkserver import run_python, signal_name

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.errors import ConfigError

from ._checks import P, build

V = 16
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)


def _bias_update(n: int = 1) -> BatchUpdate:
    return BatchUpdate(
        n, [], [(i, SamplingParams(logit_bias={3: 5.0}), [1], []) for i in range(n)], []
    )


# --- configs -----------------------------------------------------------------------------------


def test_a_config_mapping_is_an_engine_config() -> None:
    p = LogitBiasLogitsProcessor({"max_num_seqs": 2, "vocab_size": V}, "cpu", False)
    p.update_state(_bias_update(1))
    assert p.apply(torch.zeros(1, V))[0, 3].item() == 5.0


def test_a_config_mapping_with_an_unknown_field_names_it() -> None:
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['max_seqs'\]"):
        LogitBiasLogitsProcessor({"max_seqs": 2, "vocab_size": V}, "cpu", False)
    with pytest.raises(ValueError, match=r"EngineConfig\.vocab_size must be an int >= 1"):
        LogitBiasLogitsProcessor({"vocab_size": 0}, "cpu", False)


def test_a_config_without_the_fields_names_the_field() -> None:
    with pytest.raises(ValueError, match="config field 'vocab_size'"):
        LogitBiasLogitsProcessor(object(), "cpu", False)


def test_build_logitsprocs_takes_a_config_mapping_and_a_kernel_choice() -> None:
    procs = build_logitsprocs({"max_num_seqs": 2, "vocab_size": V}, "cpu", False, kernels="torch")
    assert procs.pipeline.kernels == "torch"
    procs.update_state(_bias_update(1))
    bias = next(p for p in procs.all if isinstance(p, LogitBiasLogitsProcessor))
    assert bias.apply(torch.zeros(1, V))[0, 3].item() == 5.0
    with pytest.raises(ValueError, match="unknown field"):
        build_logitsprocs({"vocab": V}, "cpu", False)
    with pytest.raises(ValueError, match="kernels"):
        build_logitsprocs(CFG, "cpu", False, kernels="cuda")


SRC = Path(__file__).resolve().parents[2] / "python"


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_num_seqs", -1), ("max_num_seqs", 0), ("vocab_size", -5), ("max_num_seqs", None)],
)
def test_a_bad_duck_typed_config_names_the_config_field(field: str, value: object) -> None:
    sizes = {"max_num_seqs": 4, "vocab_size": 8, field: value}
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=sizes["max_num_seqs"]),
        model_config=SimpleNamespace(get_vocab_size=lambda: sizes["vocab_size"]),
    )
    with pytest.raises(ValueError, match=f"config field '{field}'"):
        MinPLogitsProcessor(cfg, "cpu", False)


def test_an_allocation_that_fails_is_a_memory_error_in_a_subprocess() -> None:
    """Sizes that pass the range checks but cannot be allocated (a huge per-request cap)."""
    script = textwrap.dedent(
        """
        import glob, importlib.util, os, resource, sys
        path = glob.glob(os.path.join(sys.argv[1], "logitsproc_rs", "_core*.so"))[0]
        spec = importlib.util.spec_from_file_location("logitsproc_rs._core", path)
        _core = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_core)
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        try:
            _core.Pipeline(2**20, 50, tables=['allowed'], caps=[('max_allowed_token_ids', 255)])
        except MemoryError as e:
            print("raised", type(e).__name__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(SRC)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("raised MemoryError"), out.stdout + out.stderr[-2000:]


def test_a_config_error_names_the_config_field_not_a_request() -> None:
    cfg = EngineConfig(
        max_num_seqs=2, vocab_size=8, reasoning_start_token_ids=[1], reasoning_end_token_ids=[9]
    )
    with pytest.raises(ValueError, match="config field 'reasoning_end_token_ids'") as e:
        build_logitsprocs(cfg, "cpu", False)
    assert "request" not in str(e.value)


_LOAD_CORE = """
import glob, importlib.util, os, sys
path = glob.glob(os.path.join(sys.argv[1], "logitsproc_rs", "_core*.so"))[0]
spec = importlib.util.spec_from_file_location("logitsproc_rs._core", path)
_core = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_core)
"""


@pytest.mark.parametrize(
    "expr",
    [
        "_core.Pipeline(2**62, 50, tables=['min_p'])",
        "_core.Pipeline(2**40, 50, tables=['logit_bias'], "
        "caps=[('max_logit_bias_entries', 2**30)])",
        "_core.Pipeline(2**33, 50, tables=['min_tokens'], caps=[('max_stop_token_ids', 2**31)])",
        "_core.Pipeline(2**62, 50, tables=['logit_bias'], caps=[('max_logit_bias_entries', 4)])",
        "build_logitsprocs(EngineConfig(max_num_seqs=2**40, vocab_size=50), 'cpu', False)",
    ],
)
def test_huge_capacity_raises_instead_of_aborting(expr: str) -> None:
    """A capacity whose tables cannot be allocated (or whose size overflows) must raise an
    ordinary ``Exception`` (ValueError / MemoryError / OverflowError), not abort the process
    (allocation failure) or raise pyo3's ``PanicException`` (a ``BaseException``)."""
    src = Path(__file__).resolve().parents[2] / "python"
    if expr.startswith("build_logitsprocs"):
        setup = "from logitsproc_rs import EngineConfig, build_logitsprocs\n"
    else:
        setup = _LOAD_CORE
    script = setup + textwrap.dedent(
        f"""
        try:
            {expr}
        except (ValueError, MemoryError, OverflowError) as e:
            print("raised", type(e).__name__)
        except BaseException as e:
            print("bad exception", type(e).__module__, type(e).__name__)
        else:
            print("no error")
        """
    )
    # Served: the error path imports logitsproc_rs (and torch), 6-11 s per fresh interpreter.
    r = run_python(script, [str(src)], timeout=120)
    assert r.returncode == 0, f"process died (rc {signal_name(r.returncode)}): {r.stderr[-500:]}"
    assert r.stdout.startswith("raised"), r.stdout


@pytest.mark.parametrize("cap_field", ["max_logit_bias_entries", "max_stop_token_ids"])
def test_cap_overflow_never_panics(cap_field: str) -> None:
    """``max_num_seqs * cap`` overflowing usize must be refused up front (ValueError /
    MemoryError / OverflowError), not wrap to a tiny buffer that panics on the first update."""
    try:
        cfg = EngineConfig(max_num_seqs=16, vocab_size=50, **{cap_field: 2**60})
        procs = build(cfg)
    except (ValueError, MemoryError, OverflowError):
        return
    update = BatchUpdate(
        batch_size=1,
        removed=[],
        added=[(0, P(logit_bias={1: 1.0}, min_tokens=2, all_stop_token_ids={3}), None, [])],
        moved=[],
    )
    for name, p in procs.items():
        try:
            p.update_state(update)
            p.apply(torch.zeros(1, 50))
        except Exception:
            raise
        except BaseException as e:  # pyo3's PanicException
            pytest.fail(f"{name}: {type(e).__name__}: {e}")


# --- duck-typed config sizes: an int (numpy's too), never a bool, a float or a str ------------


def _duck(
    max_num_seqs: object = 4,
    vocab_size: object = V,
    spec: object = None,
    **caps: object,
) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab_size),
        speculative_config=None if spec is None else SimpleNamespace(num_speculative_tokens=spec),
        **caps,
    )


NOT_A_SIZE = [True, False, np.True_, 4.0, 4.5, "4", b"4", [4], None, object(), 1j]
SIZES = [
    "max_num_seqs",
    "vocab_size",
    "num_speculative_tokens",
    "max_logit_bias_entries",
    "max_stop_token_ids",
    "max_bad_words",
    "max_bad_word_len",
    "max_allowed_token_ids",
]


def _with(field: str, value: object) -> SimpleNamespace:
    if field in ("max_num_seqs", "vocab_size"):
        return _duck(**{field: value})
    if field == "num_speculative_tokens":
        return _duck(spec=value)
    return _duck(**{field: value})


@pytest.mark.parametrize("value", NOT_A_SIZE, ids=lambda v: repr(v)[:16])
@pytest.mark.parametrize("field", SIZES)
def test_a_duck_typed_size_that_is_not_an_int_names_the_field(field: str, value: object) -> None:
    """``True`` was taken as 1, ``4.5`` as 4 and ``"4"`` as 4, silently."""
    if field == "num_speculative_tokens" and value is None:
        return  # None: speculative decoding off
    with pytest.raises(ConfigError, match=f"config field '{field}'") as e:
        build_logitsprocs(_with(field, value), "cpu", False)
    assert e.value.field == field


@pytest.mark.parametrize("field", SIZES)
def test_a_duck_typed_size_may_be_a_numpy_int(field: str) -> None:
    value = np.int64(2 if field == "num_speculative_tokens" else 8)
    procs = build_logitsprocs(_with(field, value), "cpu", False)
    assert procs.pipeline is not None


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_while_reading_a_config_propagates(exc: type) -> None:
    def vocab() -> int:
        raise exc

    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=4),
        model_config=SimpleNamespace(get_vocab_size=vocab),
    )
    with pytest.raises(exc):
        build_logitsprocs(cfg, "cpu", False)

    class Index:
        def __index__(self) -> int:
            raise exc

    with pytest.raises(exc):
        build_logitsprocs(_duck(max_num_seqs=Index()), "cpu", False)


@pytest.mark.parametrize("max_rows", [0, -1, True, False, 2.0, "8", np.True_])
def test_max_rows_must_be_a_positive_int(max_rows: object) -> None:
    """``max_rows=0`` was accepted (a stable-slot pipeline that can map no row)."""
    with pytest.raises(ConfigError, match="max_rows") as e:
        build_logitsprocs(CFG, "cpu", False, stable_slots=True, max_rows=max_rows)
    assert e.value.field == "max_rows"
    ok = build_logitsprocs(CFG, "cpu", False, stable_slots=True, max_rows=np.int64(5))
    assert ok.pipeline is not None


@pytest.mark.parametrize("spec", [2**20, 2**40, 2**62, 2**64 + 3])
def test_a_huge_num_speculative_tokens_names_itself(spec: int) -> None:
    """It used to be refused as ``max_stop_token_ids`` (a cap sized by the draft rows)."""
    with pytest.raises(ValueError) as e:
        build_logitsprocs(_duck(spec=spec), "cpu", False)
    assert getattr(e.value, "field", None) == "num_speculative_tokens", str(e.value)
    with pytest.raises(ValueError) as e:
        build_logitsprocs(
            EngineConfig(max_num_seqs=4, vocab_size=V, num_speculative_tokens=spec), "cpu", False
        )
    assert getattr(e.value, "field", None) == "num_speculative_tokens", str(e.value)


@pytest.mark.parametrize("spec", [1023, 1024, 2000])
def test_a_too_large_num_speculative_tokens_states_the_largest_that_fits(spec: int) -> None:
    """With max_num_seqs=256 it said "1024 is outside the supported range [1, 1024]" (and
    k = 1023: "[1, 256]"), one more than fits. (``the_stated_draft_bound_is_the_largest_that_fits``
    in ``rust/src/tables/mod.rs`` builds at the bound.)"""
    cfg = EngineConfig(max_num_seqs=256, vocab_size=V, num_speculative_tokens=spec)
    with pytest.raises(ValueError, match=r"supported range \[1, (\d+)\]") as e:
        build_logitsprocs(cfg, "cpu", False)
    assert e.value.field == "num_speculative_tokens"
    bound = int(re.search(r"\[1, (\d+)\]", str(e.value)).group(1))
    assert bound < spec, str(e.value)


@pytest.mark.parametrize("max_rows", [2**40, 2**64 + 1])
def test_a_huge_max_rows_names_itself(max_rows: int) -> None:
    with pytest.raises(ValueError) as e:
        build_logitsprocs(CFG, "cpu", False, stable_slots=True, max_rows=max_rows)
    assert getattr(e.value, "field", None) == "max_rows", str(e.value)


@pytest.mark.parametrize(
    "ids", ["12", 3, [1, True], [1, 2.0], [np.True_], [-1], [V]], ids=lambda v: repr(v)[:16]
)
def test_bad_reasoning_ids_in_a_duck_typed_config_name_the_field(ids: object) -> None:
    cfg = _duck()
    cfg.reasoning_config = SimpleNamespace(
        reasoning_start_token_ids=[1], reasoning_end_token_ids=ids
    )
    with pytest.raises(ValueError, match="reasoning_end_token_ids") as e:
        build_logitsprocs(cfg, "cpu", False)
    assert isinstance(e.value, ConfigError)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:99", "nodevice", 3.5])
def test_a_device_this_machine_has_not_is_a_config_error(device: object) -> None:
    """A CUDA device on a machine without CUDA raised torch's RuntimeError."""
    if torch.cuda.is_available() and device in ("cuda", "cuda:0"):
        pytest.skip("this machine has that device")
    with pytest.raises(ConfigError, match="device") as e:
        build_logitsprocs(CFG, device, False)  # type: ignore[arg-type]
    assert e.value.field == "device"
