"""Historical and likely crash cases, each in a process of its own.

Each case runs in a child Python with a bounded address space (``RLIMIT_AS``: what the
interpreter and torch already use plus a few GiB) and a watchdog, so a regression that aborts,
segfaults, raises pyo3's ``PanicException`` (a ``BaseException``), loops forever or eats the
machine's memory is one failing test here, not a dead test run. The child is forked from the
tests' fork server (``tests/_forkserver.py``: one Python per pytest process that has imported
torch and logitsproc_rs), not started fresh; ``LOGITSPROC_CRASH_FRESH=1`` starts a fresh
interpreter per case instead. The child prints one line:

* ``RAISED <type> <message>``: a ``ValueError`` or ``MemoryError`` (the contract for bad input);
* ``OK <result>``: the call returned;
* ``OTHER <type> <message>``: some other ``Exception``;
* ``BAD <type> <message>``: a ``BaseException`` that is not an ``Exception`` (a panic).

and the test checks the line against what the case allows.
"""

from __future__ import annotations

import subprocess
import textwrap

import _forkserver
import pytest
from _forkserver import run_python, signal_name

# Runs before each case: imports, then the address-space limit (after torch's import, which
# reserves a lot of virtual memory) and a watchdog that dumps the stack and exits.
PRELUDE = """
import faulthandler, itertools, math, resource, sys
from collections.abc import Sequence
from types import SimpleNamespace
import torch
torch.set_num_threads(1)
from logitsproc_rs import (
    BadWordsLogitsProcessor, BatchUpdate, EngineConfig, MinTokensLogitsProcessor,
    MoveDirectionality, SamplingParams, build_logitsprocs,
)

def _vm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0

_limit = _vm_bytes() + EXTRA_GIB * (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))
faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)

def one_request(cfg, params, prompt=None, output=None, **kw):
    procs = build_logitsprocs(cfg, "cpu", False, **kw)
    output = [] if output is None else output
    procs.update_state(BatchUpdate(1, [], [(0, params, prompt, output)], []))
    return procs

def raw_params(**fields):
    sp = SamplingParams()
    for k, v in fields.items():
        object.__setattr__(sp, k, v)
    return sp

def apply_all(procs, logits):
    for p in procs.non_argmax_invariant:
        logits = p.apply(logits)
    for p in procs.argmax_invariant:
        logits = p.apply(logits)
    return logits
"""

EPILOGUE = """
try:
    _result = case()
except (ValueError, MemoryError) as e:
    print("RAISED", type(e).__name__, str(e)[:300].replace(chr(10), " "), flush=True)
except Exception as e:
    print("OTHER", type(e).__module__, type(e).__name__, str(e)[:300].replace(chr(10), " "))
except BaseException as e:
    print("BAD", type(e).__module__, type(e).__name__, str(e)[:300].replace(chr(10), " "))
else:
    print("OK", repr(_result)[:200], flush=True)
faulthandler.cancel_dump_traceback_later()
"""

# Library bugs found by these cases (test id -> diagnosis), each a strict xfail until fixed.
# All that were found are fixed; the mechanism stays for the next one.
KNOWN_BUGS: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _known_bugs(request: pytest.FixtureRequest) -> None:
    reason = KNOWN_BUGS.get(request.node.name)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


RAISED = ("RAISED",)
EITHER = ("RAISED", "OK")
ANY_EXCEPTION = ("RAISED", "OK", "OTHER")


def run_case(body: str, allowed: tuple[str, ...], extra_gib: int = 3, watchdog_s: int = 60):
    script = (
        PRELUDE.replace("EXTRA_GIB", str(extra_gib)).replace("WATCHDOG_S", str(watchdog_s))
        + textwrap.dedent(body)
        + EPILOGUE
    )
    # The child's environment: PYTHONPATH=python, RUST_BACKTRACE=0, OMP_NUM_THREADS=1.
    try:
        r = run_python(script, timeout=watchdog_s + 60)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung past its watchdog: {e}")
    tail = (r.stderr or "")[-1500:]
    assert r.returncode == 0, f"the child died (rc {signal_name(r.returncode)}); stderr:\n{tail}"
    lines = [
        ln
        for ln in r.stdout.splitlines()
        if ln.split(" ", 1)[0] in ("RAISED", "OK", "OTHER", "BAD")
    ]
    assert lines, f"no result line; stdout {r.stdout!r}; stderr:\n{tail}"
    line = lines[-1]
    assert line.split(" ", 1)[0] in allowed, f"{line}\nstderr:\n{tail}"
    return line


# --------------------------------------------------------------------------------------------
# Speculative decoding: absurd draft counts

SPEC_SETUP = """
cfg = EngineConfig(max_num_seqs=4, vocab_size=50, num_speculative_tokens=2)
params = SamplingParams(min_tokens=5, stop_token_ids=[3], bad_words_token_ids=[[1, 2]])
procs = one_request(cfg, params)
mt = next(p for p in procs.all if isinstance(p, MinTokensLogitsProcessor))
bw = next(p for p in procs.all if isinstance(p, BadWordsLogitsProcessor))
"""

DRAFTS = ["[2**40]", "[2**63 - 1]", "[2**64]", "[2**70]", "[-1]", "[3, 2**62]", "[1.5]", "[True]"]


@pytest.mark.parametrize("drafts", DRAFTS)
def test_min_tokens_spec_decode_huge_draft_count(drafts: str) -> None:
    run_case(
        SPEC_SETUP
        + f"""
def case():
    return mt.apply_with_spec_decode(torch.zeros(3, 50), {drafts}).shape
""",
        RAISED,
    )


@pytest.mark.parametrize("drafts", DRAFTS)
def test_bad_words_spec_decode_huge_draft_count(drafts: str) -> None:
    run_case(
        SPEC_SETUP
        + f"""
def case():
    return bw.apply_with_spec_decode(torch.zeros(3, 50), {drafts}, [[1, 2, 1]]).shape
""",
        RAISED,
    )


@pytest.mark.parametrize(
    "spec_ids", ["[[2**40, 1]]", "[[-5]]", "[[1] * 10**6]", "[[1]] * 10**5", "[None]", "[[1.5]]"]
)
def test_bad_words_spec_decode_bad_draft_tokens(spec_ids: str) -> None:
    run_case(
        SPEC_SETUP
        + f"""
def case():
    return bw.apply_with_spec_decode(torch.zeros(3, 50), [3], {spec_ids}).shape
""",
        RAISED,
    )


def test_spec_decode_endless_draft_counts() -> None:
    run_case(
        SPEC_SETUP
        + """
def case():
    return mt.apply_with_spec_decode(torch.zeros(3, 50), itertools.repeat(1)).shape
""",
        RAISED,
        extra_gib=1,
    )


# --------------------------------------------------------------------------------------------
# Capacities


@pytest.mark.parametrize("vocab", [50, 32000])
def test_max_num_seqs_2_pow_20_builds_fast_or_refuses(vocab: int) -> None:
    """Either it builds within the watchdog and a few GiB (and then works), or it is a clear
    MemoryError / ValueError."""
    run_case(
        f"""
def case():
    cfg = EngineConfig(max_num_seqs=2**20, vocab_size={vocab})
    procs = build_logitsprocs(cfg, "cpu", False)
    procs.update_state(BatchUpdate(1, [], [(0, SamplingParams(min_p=0.5, logit_bias={{1: 2.0}},
        repetition_penalty=1.5), [1, 2], [])], []))
    return apply_all(procs, torch.zeros(1, {vocab})).shape
""",
        EITHER,
        watchdog_s=90,
    )


# --------------------------------------------------------------------------------------------
# Endless and lying containers

ENDLESS = {
    "allowed_token_ids": "raw_params(allowed_token_ids=itertools.count())",
    "stop_ids": "raw_params(min_tokens=3, _all_stop_token_ids=itertools.repeat(1))",
    "bad_word": "raw_params(bad_words_token_ids=[itertools.repeat(1)])",
    "bad_words_list": "raw_params(bad_words_token_ids=itertools.repeat([1]))",
    "logit_bias_items": "raw_params(logit_bias=EndlessDict({1: 1.0}))",
}

ENDLESS_DICT = """
class EndlessDict(dict):
    def items(self):
        return ((i % 40, 1.0) for i in itertools.count())
    def __iter__(self):
        return (i % 40 for i in itertools.count())
    def keys(self):
        return iter(self)
    def __len__(self):
        return 1
"""


@pytest.mark.parametrize("field", sorted(ENDLESS))
def test_endless_iterator_in_params(field: str) -> None:
    cfg = "EngineConfig(max_num_seqs=2, vocab_size=50, max_bad_word_len=4, max_allowed_token_ids=8)"
    run_case(
        ENDLESS_DICT
        + f"""
def case():
    procs = one_request({cfg}, {ENDLESS[field]}, prompt=[1])
    return apply_all(procs, torch.zeros(1, 50)).shape
""",
        # A dict subclass may legitimately be read through the dict API (ignoring the
        # overrides): then it is a one-entry dict.
        EITHER if field == "logit_bias_items" else RAISED,
        extra_gib=1,
    )


@pytest.mark.parametrize("where", ["prompt", "output", "removed", "added", "moved"])
def test_endless_iterator_in_the_update(where: str) -> None:
    run_case(
        f"""
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50)
    procs = build_logitsprocs(cfg, "cpu", False)
    sp = SamplingParams(repetition_penalty=1.5, min_tokens=2, stop_token_ids=[1])
    prompt, output, removed, added, moved = [1], [], [], None, []
    endless = itertools.repeat(0)
    if "{where}" == "prompt":
        prompt = endless
    elif "{where}" == "output":
        output = endless
    elif "{where}" == "removed":
        removed = endless
    elif "{where}" == "moved":
        moved = itertools.repeat((0, 1, MoveDirectionality.SWAP))
    added = [(0, sp, prompt, output)]
    if "{where}" == "added":
        added = itertools.repeat((0, sp, [1], []))
    procs.update_state(SimpleNamespace(batch_size=1, removed=removed, added=added, moved=moved))
    return apply_all(procs, torch.zeros(1, 50)).shape
""",
        RAISED,
        extra_gib=1,
    )


LYING = """
class Raising(Sequence):
    def __len__(self):
        return 3
    def __getitem__(self, i):
        raise RuntimeError("boom")
    def __iter__(self):
        raise RuntimeError("boom")

class HugeLen(Sequence):
    def __len__(self):
        return 2**62
    def __getitem__(self, i):
        if isinstance(i, int) and 0 <= i < 2**62:
            return 1
        raise IndexError(i)

class LenOverflow(Sequence):
    def __len__(self):
        return 2**70
    def __getitem__(self, i):
        return 1

class HugeList(list):
    def __len__(self):
        return 2**62
"""


@pytest.mark.parametrize("kind", ["Raising", "HugeLen", "LenOverflow", "HugeList"])
@pytest.mark.parametrize(
    "where", ["prompt", "output", "removed", "added", "moved", "allowed", "bad_words", "stop"]
)
def test_lying_sequence(kind: str, where: str) -> None:
    """A sequence whose ``__getitem__`` raises or whose ``__len__`` is absurd: a ValueError (or,
    for containers the core never needs the length of, a normal read); never a capacity
    overflow panic, an allocation abort or a hang."""
    run_case(
        LYING
        + f"""
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50, max_bad_word_len=4, max_allowed_token_ids=8)
    procs = build_logitsprocs(cfg, "cpu", False)
    bad = {kind}() if "{kind}" != "HugeList" else HugeList([1])
    fields = dict(repetition_penalty=1.5, min_tokens=2, stop_token_ids=[1])
    sp = SamplingParams(**fields)
    if "{where}" == "allowed":
        object.__setattr__(sp, "allowed_token_ids", bad)
    elif "{where}" == "bad_words":
        object.__setattr__(sp, "bad_words_token_ids", [bad])
    elif "{where}" == "stop":
        object.__setattr__(sp, "_all_stop_token_ids", bad)
    prompt = bad if "{where}" == "prompt" else [1]
    output = bad if "{where}" == "output" else []
    added = [(0, sp, prompt, output)]
    removed = bad if "{where}" == "removed" else []
    moved = bad if "{where}" == "moved" else []
    if "{where}" == "added":
        added = bad
    procs.update_state(SimpleNamespace(batch_size=1, removed=removed, added=added, moved=moved))
    return apply_all(procs, torch.zeros(1, 50)).shape
""",
        # A list subclass is read through the list API (its real length, one entry), which is
        # fine; everything else must be refused.
        EITHER if kind == "HugeList" else RAISED,
        extra_gib=1,
    )


def test_sampled_token_ids_lying_sequence() -> None:
    run_case(
        LYING
        + """
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50)
    procs = one_request(cfg, SamplingParams(repetition_penalty=1.5), [1], token_feed=True)
    for bad in (Raising(), HugeLen(), LenOverflow(), itertools.repeat(1)):
        try:
            procs.update_state(None, sampled_token_ids=bad)
        except (ValueError, MemoryError):
            continue
        raise AssertionError(f"accepted {type(bad).__name__}")
    return "all refused"
""",
        ("OK",),
        extra_gib=1,
    )


# --------------------------------------------------------------------------------------------
# logit_bias dicts that change while they are read

MUTATING = """
class MutatingItems(dict):
    def items(self):
        for k, v in list(dict.items(self)):
            self[k + 100] = v
            yield k, v
    def __iter__(self):
        for k in list(dict.keys(self)):
            self[k + 200] = 1.0
            yield k
    def keys(self):
        return iter(self)

class GrowingFloat:
    # A bias value whose __float__ inserts keys into the dict being read.
    def __init__(self, d):
        self.d = d
    def __float__(self):
        for i in range(1000, 1100):
            self.d[i] = 1.0
        return 1.0

class ClearingFloat:
    def __init__(self, d):
        self.d = d
    def __float__(self):
        self.d.clear()
        return 1.0

class GrowingIndex:
    # A token id whose __index__ inserts keys into the dict being read.
    def __init__(self, d):
        self.d = d
    def __index__(self):
        for i in range(2000, 2100):
            self.d[i] = 1.0
        return 3
    def __hash__(self):
        return 12345
    def __eq__(self, other):
        return self is other
"""


@pytest.mark.parametrize("kind", ["items", "float_grows", "float_clears", "index_grows"])
def test_logit_bias_mutated_while_read(kind: str) -> None:
    run_case(
        MUTATING
        + f"""
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50)
    if "{kind}" == "items":
        lb = MutatingItems({{1: 1.0, 2: -1.0}})
    else:
        lb = {{1: 1.0, 2: -1.0}}
        cls = {{"float_grows": GrowingFloat, "float_clears": ClearingFloat}}.get("{kind}")
        if cls is not None:
            lb[4] = cls(lb)
        else:
            lb[GrowingIndex(lb)] = 1.0
    procs = one_request(cfg, raw_params(logit_bias=lb), [1])
    return apply_all(procs, torch.zeros(1, 50))[0, :5].tolist()
""",
        EITHER,
    )


# --------------------------------------------------------------------------------------------
# Logits that lie about themselves

LIARS = """
class StrideLiar(torch.Tensor):
    def stride(self, *args):
        return 10**6 if args else (10**6, 1)

class PtrLiar(torch.Tensor):
    def data_ptr(self):
        return 8

class StorageLiar(torch.Tensor):
    def storage_offset(self):
        return -10**6

class CudaLiar(torch.Tensor):
    @property
    def device(self):
        return torch.device("cuda", 0)
    @property
    def is_cuda(self):
        return True

class ShapeLiar(torch.Tensor):
    @property
    def shape(self):
        return torch.Size([1, 50])
    def size(self, *args):
        return 50 if args else torch.Size([1, 50])
"""


@pytest.mark.parametrize("liar", ["StrideLiar", "PtrLiar", "StorageLiar", "CudaLiar", "ShapeLiar"])
def test_tensor_subclass_lying_to_apply(liar: str) -> None:
    """Every processor's apply on a lying tensor subclass: refused, or applied through torch
    (the host kernels only trust an exact ``torch.Tensor``) with the right result."""
    run_case(
        LIARS
        + f"""
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50)
    params = SamplingParams(min_p=0.5, logit_bias={{1: 2.0}}, repetition_penalty=1.5,
        frequency_penalty=0.5, min_tokens=3, stop_token_ids=[4], bad_words_token_ids=[[7]])
    procs = one_request(cfg, params, [1, 2, 3], [5])
    shape = (1, 50) if "{liar}" != "ShapeLiar" else (1, 8)
    base = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x = torch.Tensor._make_subclass({liar}, base.clone())
    want = apply_all(procs, base.clone()) if "{liar}" != "ShapeLiar" else None
    got = apply_all(procs, x)
    if want is not None:
        assert torch.equal(torch.Tensor(got.as_subclass(torch.Tensor)), want), "wrong result"
    return "applied"
""",
        EITHER,
    )


def test_meta_and_odd_device_logits() -> None:
    run_case(
        """
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50)
    params = SamplingParams(min_p=0.5, logit_bias={1: 2.0}, repetition_penalty=1.5)
    procs = one_request(cfg, params, [1, 2, 3], [5])
    outcomes = []
    for x in (torch.zeros(1, 50, device="meta"), torch.zeros(1, 50)[:, ::1].t().t(),
              torch.zeros(50, 1).t(), torch.zeros(1, 100)[:, ::2], torch.zeros(1, 50).to_sparse()):
        try:
            apply_all(procs, x)
            outcomes.append("ok")
        except (ValueError, RuntimeError, NotImplementedError) as e:
            outcomes.append(type(e).__name__)
    return outcomes
""",
        ("OK",),
    )


def test_cuda_device_without_cuda_is_a_config_error() -> None:
    """Building for CUDA on a machine without it: a ConfigError naming the device (it was
    torch's RuntimeError); with it, a working pipeline; never an abort."""
    line = run_case(
        """
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50)
    procs = build_logitsprocs(cfg, "cuda", True)
    procs.update_state(BatchUpdate(1, [], [(0, SamplingParams(min_p=0.5), None, [])], []))
    return "built"
""",
        EITHER,
    )
    if line.startswith("RAISED"):
        assert line.startswith("RAISED ConfigError device:"), line


def test_an_emulated_device_arena_torch_cannot_allocate_is_an_allocation_error() -> None:
    """The core's host buffers fit the memory limit, the emulated device's arena (a torch
    tensor as large) does not: an AllocationError (a MemoryError) naming the arena; it was
    torch's RuntimeError."""
    line = run_case(
        """
def case():
    cfg = EngineConfig(max_num_seqs=1024, vocab_size=50, max_allowed_token_ids=2**18)
    build_logitsprocs(cfg, "cpu", False, emulate_device=True)
    return "built"
""",
        RAISED,
        extra_gib=5,
    )
    assert line.startswith("RAISED AllocationError could not allocate the"), line


def test_a_penalties_count_matrix_torch_cannot_allocate_is_an_allocation_error() -> None:
    """On a device the penalties keep a [max_num_seqs + 1, V] int32 count matrix: 4 GiB here,
    past the child's memory limit, where the core's host buffers and the arena fit. An
    AllocationError (a MemoryError) naming it and the size asked for; it was torch's
    RuntimeError."""
    line = run_case(
        """
def case():
    cfg = EngineConfig(max_num_seqs=1023, vocab_size=2**20)
    build_logitsprocs(cfg, "cpu", False, emulate_device=True)
    return "built"
""",
        RAISED,
    )
    assert line.startswith(
        "RAISED AllocationError could not allocate the penalties' count matrix "
        "([1024, 1048576] torch.int32, 4294967296 bytes on cpu): "
    ), line


def test_cuda_looking_duck_typed_logits() -> None:
    """An object that only looks like a CUDA tensor (device, shape, dtype attributes)."""
    run_case(
        """
def case():
    cfg = EngineConfig(max_num_seqs=2, vocab_size=50)
    procs = one_request(cfg, SamplingParams(min_p=0.5, logit_bias={1: 2.0}), [1])
    fake = SimpleNamespace(device=torch.device("cuda", 0), shape=torch.Size([1, 50]),
        dtype=torch.float32, is_cuda=True, data_ptr=lambda: 8, stride=lambda *a: (50, 1),
        dim=lambda: 2, is_floating_point=lambda: True)
    for p in procs.all:
        try:
            p.apply(fake)
        except (ValueError, TypeError, AttributeError):
            pass
    return "no crash"
""",
        ("OK",),
    )


# --------------------------------------------------------------------------------------------
# The machinery itself: a case that kills its process, or hangs, is a failing test


@pytest.mark.parametrize(
    ("body", "sig"), [("os.abort()", "SIGABRT"), ("ctypes.string_at(0)", "SIGSEGV")]
)
def test_a_case_that_kills_its_process_fails_with_the_signal(body: str, sig: str) -> None:
    """What a regression that aborts or segfaults looks like: ``run_case`` fails naming the
    signal, and the fork server (when one is used) is still the same process afterwards."""
    before = None if _forkserver.FRESH else _forkserver.server().pid
    with pytest.raises(AssertionError, match=rf"the child died \(rc -\d+ \({sig}\)\)"):
        run_case(
            f"""
import ctypes, os
def case():
    {body}
""",
            ANY_EXCEPTION,
        )
    if before is not None:
        assert _forkserver.server().pid == before
        run_case("def case():\n    return 1\n", ("OK",))


def test_a_case_that_hangs_is_stopped_by_its_watchdog() -> None:
    with pytest.raises(AssertionError, match=r"the child died \(rc 1\)[\s\S]*Timeout"):
        run_case(
            """
def case():
    while True:
        pass
""",
            ANY_EXCEPTION,
            watchdog_s=2,
        )
