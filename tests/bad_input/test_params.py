"""Bad per-request params never break the processors: every invalid value of a request (MinP,
LogitBias, MinTokens and their stop ids, penalties, bad words, allowed ids, output lists) is a
``ValueError`` naming the request index and the field, and a rejected update leaves every table
exactly as it was (``_checks.check_rejected``); ``SamplingParams`` refuses bad values at
construction, naming the field."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import assert_unchanged

from logitsproc_rs import (
    BatchUpdate,
    EngineConfig,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.errors import RequestError
from logitsproc_rs.interface import direction_name
from logitsproc_rs.registry import Field

from ._checks import (
    ALL,
    CFG,
    LOGIT_BIAS,
    MIN_P,
    MIN_TOKENS,
    P,
    V,
    World,
    bad_update,
    check_rejected,
    snapshot,
    valid_add,
)
from ._junk import TORCH_DTYPES, registry_fields, registry_junk, short

# ---------------------------------------------------------------------------------------------
# Per-request parameter values


@pytest.mark.parametrize("value", [math.nan, -0.1, -1e-30, 1.0000001, 1.5, math.inf, -math.inf])
def test_min_p_out_of_range(value: float) -> None:
    check_rejected(MIN_P, bad_update((4, P(min_p=value), None, [])), 4, "min_p")


@pytest.mark.parametrize("value", ["0.1", [0.1], object(), 1j])
def test_min_p_wrong_type(value: Any) -> None:
    check_rejected(MIN_P, bad_update((4, P(min_p=value), None, [])), 4, "min_p")


@pytest.mark.parametrize("token", [V, V + 1, 10**6, -1, -V, 2**31, -(2**40)])
def test_logit_bias_token_outside_vocab(token: int) -> None:
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias={0: 1.0, token: 1.0}), None, [])), 4, "logit_bias"
    )


@pytest.mark.parametrize("bias", [math.inf, -math.inf, math.nan, 1e39, -3.5e38])
def test_logit_bias_non_finite(bias: float) -> None:
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias={3: 1.0, 4: bias}), None, [])), 4, "logit_bias"
    )


@pytest.mark.parametrize("lb", [[(1, 1.0)], {"1": 1.0}, {1: "x"}, {1.5: 1.0}, 3.0])
def test_logit_bias_wrong_type(lb: Any) -> None:
    check_rejected(LOGIT_BIAS, bad_update((4, P(logit_bias=lb), None, [])), 4, "logit_bias")


def test_logit_bias_over_cap_default_config() -> None:
    cap = CFG.max_logit_bias_entries
    lb = {t: 0.5 for t in range(cap + 1)}
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias=lb), None, [])), 4, "logit_bias", extra="cap"
    )


def test_logit_bias_over_cap_in_vocab() -> None:
    cfg = EngineConfig(max_num_seqs=8, vocab_size=50, max_logit_bias_entries=4)
    # 4 entries is fine, 5 (all inside the vocabulary) is over the cap.
    World(cfg).procs[LOGIT_BIAS].update_state(
        BatchUpdate(5, [], [(4, P(logit_bias={t: 1.0 for t in range(4)}), None, [])], [])
    )
    lb = {t: 1.0 for t in range(10, 15)}
    check_rejected(
        LOGIT_BIAS, bad_update((4, P(logit_bias=lb), None, [])), 4, "logit_bias", cfg, extra="cap"
    )


@pytest.mark.parametrize("value", [-1, -(2**40)])
def test_negative_min_tokens(value: int) -> None:
    check_rejected(MIN_TOKENS, bad_update((4, P(min_tokens=value), None, [])), 4, "min_tokens")


@pytest.mark.parametrize("value", ["3", 2.5, [3]])
def test_min_tokens_wrong_type(value: Any) -> None:
    check_rejected(MIN_TOKENS, bad_update((4, P(min_tokens=value), None, [])), 4, "min_tokens")


@pytest.mark.parametrize("stop", [{V}, {1, V + 7}, {-1}, {2**33}])
def test_stop_ids_outside_vocab(stop: set[int]) -> None:
    check_rejected(
        MIN_TOKENS,
        bad_update((4, P(min_tokens=3, all_stop_token_ids=stop), None, [])),
        4,
        "stop_token_ids",
    )


def test_stop_ids_wrong_type() -> None:
    params = SimpleNamespace(min_p=0.0, logit_bias=None, min_tokens=3, all_stop_token_ids={"eos"})
    check_rejected(MIN_TOKENS, bad_update((4, params, None, [])), 4, "stop_token_ids")


def test_stop_ids_over_cap() -> None:
    cfg = EngineConfig(max_num_seqs=8, vocab_size=50, max_stop_token_ids=3)
    stop = {1, 2, 3, 4}
    check_rejected(
        MIN_TOKENS,
        bad_update((4, P(min_tokens=3, all_stop_token_ids=stop), None, [])),
        4,
        "stop_token_ids",
        cfg,
        extra="cap",
    )


@pytest.mark.parametrize(
    "params",
    [SamplingParams(stop_token_ids=list(range(5000))), P(all_stop_token_ids=range(4))],
    ids=["ours_5000", "duck_typed_over_a_cap_of_3"],
)
def test_stop_ids_over_cap_without_min_tokens(params: Any) -> None:
    """A cap holds whether or not its field is in use: stop ids beyond it were accepted while
    min_tokens was 0 (they were only read with min_tokens on)."""
    cfg = CFG if isinstance(params, SamplingParams) else EngineConfig(8, 50, max_stop_token_ids=3)
    check_rejected(MIN_TOKENS, bad_update((4, params, None, [])), 4, "stop_token_ids", cfg, "cap")
    procs = build_logitsprocs(cfg, "cpu", False)
    with pytest.raises(RequestError) as ei:
        procs.update_state(BatchUpdate(1, [], [(0, params, None, [])], []))
    e = ei.value
    assert (e.index, e.field, e.processor) == (0, "stop_token_ids", "min_tokens"), e


def test_stop_ids_without_min_tokens_are_only_counted() -> None:
    """Up to the cap, stop ids without min_tokens are accepted as before, an id outside the
    vocabulary too (they are the engine's stop tokens; min_tokens holds none back)."""
    procs = build_logitsprocs(CFG, "cpu", False)
    fine = [
        SamplingParams(stop_token_ids=list(range(128)), eos_token_id=1),  # at the cap
        P(all_stop_token_ids={V + 7}),
    ]
    procs.update_state(BatchUpdate(2, [], [(i, p, None, []) for i, p in enumerate(fine)], []))
    assert dict(procs.pipeline.core.active())["min_tokens"] == 0


@pytest.mark.parametrize(
    ("proc", "field"), [(MIN_P, "min_p"), (LOGIT_BIAS, "logit_bias"), (MIN_TOKENS, "min_tokens")]
)
def test_params_property_raising(proc: str, field: str) -> None:
    """A params attribute whose getter raises is a ValueError naming request and field."""

    class Params:
        def __getattr__(self, name: str) -> Any:
            if name == field:
                raise RuntimeError("boom")
            return getattr(P(), name)

    check_rejected(proc, bad_update((4, Params(), None, [])), 4, field)


@pytest.mark.parametrize("proc", ALL)
def test_params_missing_attribute_reads_as_unset(proc: str) -> None:
    """Duck-typed params need only the fields a processor reads; a missing one is "not set"."""
    world = World()
    p = world.procs[proc]
    update = BatchUpdate(4, [], [(3, SimpleNamespace(), None, [])], [])
    p.update_state(update)
    before = snapshot(p, rows=4)
    twin = World().procs[proc]
    twin.update_state(BatchUpdate(4, [], [(3, P(), None, [])], []))
    assert_unchanged(snapshot(twin, rows=4), before)


@pytest.mark.parametrize("output", [(1, 2), None, "abc", 5])
def test_output_list_not_a_list(output: Any) -> None:
    check_rejected(MIN_TOKENS, bad_update((4, P(min_tokens=3), None, output)), 4, "output_tok_ids")


BAD_PARAMS: list[tuple[str, Any]] = [
    ("n", 0),
    ("n", 1.5),
    ("n", True),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("presence_penalty", math.nan),
    ("frequency_penalty", -3.0),
    ("frequency_penalty", "0.1"),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    ("temperature", -0.5),
    ("temperature", math.inf),
    ("temperature", math.nan),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("top_k", -2),
    ("top_k", 1.5),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("min_p", math.nan),
    ("seed", 1.5),
    ("seed", "7"),
    ("max_tokens", 0),
    ("max_tokens", 2.0),
    ("min_tokens", -1),
    ("min_tokens", 1.0),
    ("logprobs", -1),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1.5]),
    ("stop_token_ids", "abc"),
    ("stop_token_ids", 5),
    ("eos_token_id", -1),
    ("eos_token_id", "2"),
    ("logit_bias", [(1, 1.0)]),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"x": 1.0}),
    ("logit_bias", {1: math.inf}),
    ("logit_bias", {1: math.nan}),
    ("logit_bias", {1: "big"}),
    ("allowed_token_ids", []),
    ("allowed_token_ids", [-3]),
    ("bad_words_token_ids", [[]]),
    ("bad_words_token_ids", [[1, -2]]),
    ("thinking_token_budget", -2),
    ("thinking_token_budget", 1.5),
    ("thinking_token_budget", True),
]


@pytest.mark.parametrize(("field", "value"), BAD_PARAMS, ids=lambda v: repr(v)[:20])
def test_sampling_params_rejects(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        SamplingParams(**{field: value})


def test_sampling_params_min_tokens_above_max_tokens() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=10, max_tokens=5)
    SamplingParams(min_tokens=5, max_tokens=5)
    SamplingParams(min_tokens=50, max_tokens=None)


def test_repetition_penalty_is_checked_as_float32() -> None:
    procs = build_logitsprocs(EngineConfig(max_num_seqs=2, vocab_size=8), "cpu", False)
    for rep in (1e39, 1e-46):
        sp = SamplingParams()
        object.__setattr__(sp, "repetition_penalty", rep)
        with pytest.raises(ValueError, match="request at index 0: field 'repetition_penalty'"):
            procs.update_state(BatchUpdate(1, [], [(0, sp, [1], [])], []))


def test_endless_iterables_are_refused_at_their_cap() -> None:
    import itertools

    cfg = EngineConfig(max_num_seqs=2, vocab_size=8, max_bad_word_len=4, max_allowed_token_ids=4)
    procs = build_logitsprocs(cfg, "cpu", False)
    for field, value in (
        ("bad_words_token_ids", [itertools.repeat(1)]),
        ("allowed_token_ids", itertools.repeat(1)),
        ("_all_stop_token_ids", itertools.repeat(1)),
    ):
        sp = SamplingParams(min_tokens=3)
        object.__setattr__(sp, field, value)
        with pytest.raises(ValueError, match="cap"):
            procs.update_state(BatchUpdate(1, [], [(0, sp, None, [])], []))


@pytest.mark.parametrize("junk", ["7", None, 2.5, True, -3, 2**70])
def test_junk_in_an_output_list_is_an_error_not_a_placeholder(junk: object) -> None:
    """Only ints >= -1 (-1: an async placeholder) belong in an output list. Anything else
    used to read as a placeholder, and every later token of that request went uncounted."""
    cfg = EngineConfig(max_num_seqs=4, vocab_size=16)
    procs = build_logitsprocs(cfg, "cpu", False)
    sp = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5)
    with pytest.raises(ValueError, match="request at index 0: field 'output_tok_ids'"):
        procs.update_state(BatchUpdate(1, [], [(0, sp, [1], [3, junk])], []))
    out = [3]
    procs.update_state(BatchUpdate(1, [], [(0, sp, [1], out)], []))
    before = [v.clone() for v in procs.pipeline.arena.views]
    out.extend([junk, 4])
    add = BatchUpdate(2, [], [(1, SamplingParams(logit_bias={2: 1.0}), None, [])], [])
    with pytest.raises(ValueError, match="request at index 0: field 'output_tok_ids'"):
        procs.update_state(add)
    assert all(torch.equal(a, b) for a, b in zip(before, procs.pipeline.arena.views, strict=True))
    assert procs.pipeline.status[0] == 1  # the add in the rejected step did not land
    out[1] = 5  # the engine repairs its list: the request's later tokens count again
    procs.update_state(add)
    assert procs.pipeline.core.penalties_counted(0) == [3, 5, 4]


# ---------------------------------------------------------------------------------------------
# Numbers that are not numbers here: bools (Python's and numpy's) in a numeric field, and ints
# too large for a float, in duck-typed params (the core's reader) and in our SamplingParams.
# Every built-in and the sampler transforms on one pipeline: the whole state is compared.


def _full(**fields: Any) -> SimpleNamespace:
    """Duck-typed params with every field the built-ins and the sampler transforms read."""
    base: dict[str, Any] = {
        "min_p": 0.0,
        "logit_bias": None,
        "min_tokens": 0,
        "all_stop_token_ids": set(),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "allowed_token_ids": None,
        "bad_words_token_ids": None,
        "thinking_token_budget": None,
        "no_repeat_ngram_size": 0,
        "temperature": 1.0,
    }
    base.update(fields)
    return SimpleNamespace(**base)


class _Whole:
    """Every built-in and sampler transform on one pipeline, two live requests."""

    def __init__(self) -> None:
        self.procs = build_logitsprocs(EngineConfig(max_num_seqs=4, vocab_size=V), "cpu", False)
        self.outputs: list[list[int]] = [[3], []]
        self.procs.update_state(
            BatchUpdate(
                2,
                [],
                [
                    (0, _full(min_p=0.2, repetition_penalty=1.5), [1, 2], self.outputs[0]),
                    (1, _full(logit_bias={4: 2.0}, presence_penalty=0.5), [5], self.outputs[1]),
                ],
                [],
            )
        )

    def state(self) -> list[Any]:
        pipe = self.procs.pipeline
        core = pipe.core
        bufs = [torch.from_dlpack(core.buffer(i)).clone() for i in range(len(core.sections()))]
        return [dict(core.active()), core.status(), list(pipe.status), bufs]

    def logits(self) -> torch.Tensor:
        x = torch.randn(2, V, generator=torch.Generator().manual_seed(3))
        for p in self.procs.all:
            x = p.apply(x)
        return x


def _same(a: list[Any], b: list[Any]) -> None:
    assert a[:3] == b[:3]
    assert all(torch.equal(x, y) for x, y in zip(a[3], b[3], strict=True))


def check_whole_rejected(params: Any, field: str) -> None:
    """An update adding ``params`` at index 1 (after a valid change at index 0) is refused
    naming index 1 and ``field``; every table is as before, and the next good step gives what
    a pipeline that never saw the bad update gives."""
    world, twin = _Whole(), _Whole()
    before = world.state()
    bad = BatchUpdate(
        2,
        [],
        [(0, _full(min_p=0.9, logit_bias={1: 5.0}), [2], []), (1, params, [1], [])],
        [],
    )
    with pytest.raises(ValueError, match=rf"request at index 1: field '{field}'") as ei:
        world.procs.update_state(bad)
    assert getattr(ei.value, "index", None) == 1 and getattr(ei.value, "field", None) == field
    _same(before, world.state())
    for w in (world, twin):
        w.outputs[0].append(6)
        w.procs.update_state(None)
    _same(twin.state(), world.state())
    assert torch.equal(twin.logits(), world.logits())


def _short(v: Any) -> str:
    return repr(v)[:24]


NOT_A_NUMBER = [True, False, np.True_, np.False_, 10**400, -(10**400)]


@pytest.mark.parametrize(
    "field", ["min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"]
)
@pytest.mark.parametrize("value", NOT_A_NUMBER, ids=_short)
def test_duck_typed_float_field_refuses_bools_and_huge_ints(field: str, value: Any) -> None:
    """``True`` read as 1.0 (min_p=1: every token but the argmax masked) and was accepted."""
    check_whole_rejected(_full(**{field: value}), field)


@pytest.mark.parametrize("value", NOT_A_NUMBER, ids=_short)
def test_duck_typed_logit_bias_value_refuses_bools_and_huge_ints(value: Any) -> None:
    check_whole_rejected(_full(logit_bias={2: value}), "logit_bias")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_tokens", np.True_),
        ("min_tokens", True),
        ("logit_bias", {np.True_: 1.0}),
        ("min_tokens", 10**400),
    ],
    ids=_short,
)
def test_duck_typed_int_fields_refuse_numpy_bools_and_huge_ints(field: str, value: Any) -> None:
    check_whole_rejected(_full(**{field: value}), field)


@pytest.mark.parametrize("field", ["min_p", "presence_penalty", "repetition_penalty"])
def test_duck_typed_numpy_floats_are_numbers(field: str) -> None:
    value = {"min_p": np.float32(0.25), "presence_penalty": np.float64(0.5)}.get(
        field, np.float32(1.5)
    )
    a, b = _Whole(), _Whole()
    a.procs.update_state(BatchUpdate(3, [], [(2, _full(**{field: value}), [1], [])], []))
    b.procs.update_state(BatchUpdate(3, [], [(2, _full(**{field: float(value)}), [1], [])], []))
    _same(a.state(), b.state())


class _Interrupting:
    """A number whose conversion is interrupted (Ctrl-C while the core reads it)."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.exc = exc

    def __float__(self) -> float:
        raise self.exc

    def __index__(self) -> int:
        raise self.exc

    def __int__(self) -> int:
        raise self.exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("field", ["min_p", "min_tokens", "logit_bias"])
def test_an_interrupt_while_reading_a_number_propagates(field: str, exc: type) -> None:
    world = _Whole()
    before = world.state()
    value: Any = _Interrupting(exc)
    if field == "logit_bias":
        value = {2: value}
    with pytest.raises(exc):
        world.procs.update_state(BatchUpdate(2, [], [(1, _full(**{field: value}), [1], [])], []))
    _same(before, world.state())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_p", 10**400),
        ("min_p", -(10**400)),
        ("presence_penalty", 10**400),
        ("frequency_penalty", -(10**400)),
        ("repetition_penalty", 10**400),
        ("temperature", 10**400),
        ("top_p", 10**400),
        ("logit_bias", {1: 10**400}),
        ("min_p", np.True_),
        ("logit_bias", {1: True}),
        ("logit_bias", {1: np.True_}),
        ("logit_bias", {np.True_: 1.0}),
        ("logit_bias", {True: 1.0}),
    ],
    ids=_short,
)
def test_sampling_params_refuses_huge_ints_and_bools_naming_the_field(
    field: str, value: Any
) -> None:
    """An int too large for a float raised OverflowError (not a ValueError)."""
    with pytest.raises(RequestError, match=rf"\b{field}\b") as ei:
        SamplingParams(**{field: value})
    assert ei.value.field == field


# ---------------------------------------------------------------------------------------------
# Move directions: a bool is not a direction (True read as 1, UNIDIRECTIONAL).


@pytest.mark.parametrize("direction", [True, False, np.True_, np.int64(2), 2.0, "SWAP", None])
def test_move_direction_that_is_not_a_direction(direction: Any) -> None:
    for proc in ALL:
        check_rejected(
            proc,
            BatchUpdate(5, [], [valid_add()], [(0, 2, direction)]),
            0,
            "moved",
        )


@pytest.mark.parametrize("direction", [True, False, np.True_, 2.0, "SWAP", None])
def test_python_readers_of_directions_refuse_what_the_core_refuses(direction: Any) -> None:
    assert direction_name(direction) is None


def test_a_direction_whose_name_raises_an_interrupt_propagates() -> None:
    class Direction:
        @property
        def _name_(self) -> str:
            raise KeyboardInterrupt

    world = World()
    proc = world.procs[MIN_P]
    before = snapshot(proc)
    with pytest.raises(KeyboardInterrupt):
        proc.update_state(BatchUpdate(3, [], [], [(0, 2, Direction())]))
    assert_unchanged(before, snapshot(proc))


# ---------------------------------------------------------------------------------------------
# List fields of our SamplingParams (also what the bridges read from extra_args["logitsproc_rs"]):
# whatever they hold, a RequestError naming the field; an interrupt propagates.


class _LyingLen(list):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 10**30


class _RaisingIter:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __iter__(self) -> Any:
        raise self.exc


LIST_JUNK = [
    True,
    np.True_,
    10**400,
    1.5,
    5,
    object(),
    torch.tensor(1),
    torch.tensor([1, 2]),
    _RaisingIter(RuntimeError("boom")),
    [_RaisingIter(RuntimeError("boom"))],
    [1, True],
    [np.int64(1)],
    "12",
]


@pytest.mark.parametrize("value", LIST_JUNK, ids=_short)
@pytest.mark.parametrize("field", ["allowed_token_ids", "stop_token_ids", "bad_words_token_ids"])
def test_sampling_params_list_fields_refuse_junk_naming_the_field(field: str, value: Any) -> None:
    """A bad-words list that is an int raised TypeError; a 0-d tensor or a raising
    ``__iter__`` escaped as TypeError / RuntimeError (a lying ``__len__``: OverflowError)."""
    if field == "bad_words_token_ids" and isinstance(value, list) and value != [1, True]:
        value = [value]
    with pytest.raises(RequestError, match=field) as ei:
        SamplingParams(**{field: value})
    assert ei.value.field == field


@pytest.mark.parametrize("field", ["allowed_token_ids", "stop_token_ids", "bad_words_token_ids"])
def test_sampling_params_list_field_interrupt_propagates(field: str) -> None:
    with pytest.raises(KeyboardInterrupt):
        SamplingParams(**{field: _RaisingIter(KeyboardInterrupt())})


def test_sampling_params_list_with_a_lying_len_is_read_by_its_items() -> None:
    assert SamplingParams(allowed_token_ids=_LyingLen([1, 2])).allowed_token_ids == [1, 2]


def test_sampling_params_endless_list_is_refused() -> None:
    import itertools

    with pytest.raises(RequestError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=itertools.count())


# ---------------------------------------------------------------------------------------------
# Every field of the core's registry, by its kind (``_junk``): each value no request may hold
# is refused naming the request and the field, with every table as before; by our
# SamplingParams too, naming the field. A field added to the registry inherits these.


def _every_table() -> Any:
    """Every built-in and every opt-in processor on one pipeline (reasoning markers too)."""
    from logitsproc_rs.builtin import OPT_IN_PROCESSORS

    cfg = EngineConfig(
        max_num_seqs=4, vocab_size=V, reasoning_start_token_ids=[7], reasoning_end_token_ids=[8]
    )
    return build_logitsprocs(cfg, "cpu", False, custom_logitsprocs=OPT_IN_PROCESSORS)


def _raw(**fields: Any) -> SamplingParams:
    """Our SamplingParams holding ``fields`` unchecked (what a vLLM SamplingParams is to us)."""
    sp = SamplingParams(min_tokens=2, dry_multiplier=0.5, no_repeat_ngram_size=2)
    for k, v in fields.items():
        # (the stop ids the core reads are a property over this one)
        object.__setattr__(sp, "_all_stop_token_ids" if k == "all_stop_token_ids" else k, v)
    return sp


class _Everything(_Whole):
    def __init__(self) -> None:
        self.procs = _every_table()
        self.outputs = [[3], []]
        self.procs.update_state(
            BatchUpdate(
                2,
                [],
                [
                    (0, _raw(min_p=0.2, repetition_penalty=1.5), [1, 2], self.outputs[0]),
                    (1, _raw(logit_bias={4: 2.0}, typical_p=0.5), [5], self.outputs[1]),
                ],
                [],
            )
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [pytest.param(f, v, id=f"{f.name}-{short(v)}") for f, v in registry_junk()],
)
def test_every_registry_field_refuses_junk_in_the_core(field: Field, value: Any) -> None:
    world, twin = _Everything(), _Everything()
    before = world.state()
    bad = BatchUpdate(
        2, [], [(0, _raw(min_p=0.9), [2], []), (1, _raw(**{field.attr: value}), [1], [])], []
    )
    with pytest.raises(RequestError, match=rf"request at index 1: field '{field.name}'") as ei:
        world.procs.update_state(bad)
    assert ei.value.index == 1 and ei.value.field == field.name
    _same(before, world.state())
    for w in (world, twin):
        w.outputs[0].append(6)
        w.procs.update_state(None)
    _same(twin.state(), world.state())
    assert torch.equal(twin.logits(), world.logits())


# The SamplingParams argument each registry field is given by (the stop ids the core reads are
# ``all_stop_token_ids``: stop_token_ids and EOS).
_ARG = {"all_stop_token_ids": "stop_token_ids"}


@pytest.mark.parametrize(
    ("field", "value"),
    [pytest.param(f, v, id=f"{f.name}-{short(v)}") for f, v in registry_junk()],
)
def test_every_registry_field_refuses_junk_in_sampling_params(field: Field, value: Any) -> None:
    """An int too large for a float escaped the new float fields as OverflowError; DRY's
    breakers were read without a bound (an endless one ran into MemoryError) and a raising
    ``__iter__`` escaped as RuntimeError; penalty_last_n of 2**70 was accepted."""
    arg = _ARG.get(field.attr, field.attr)
    with pytest.raises(RequestError, match=rf"\b{arg}\b") as ei:
        SamplingParams(**{arg: value})
    assert ei.value.field == arg


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize(
    "field", [f for f in registry_fields() if f.kind in ("float", "int", "opt_int")], ids=str
)
def test_a_0d_tensor_in_a_number_field_reads_as_its_value_or_is_refused(
    field: Field, dtype: torch.dtype
) -> None:
    """A 0-d tensor in a number field is the number it holds (as a numpy scalar is), or refused
    naming the field; a bool tensor is always refused (it read as 0 / 1)."""
    value = torch.tensor(1, dtype=dtype)
    a, b = _Everything(), _Everything()
    add = (2, _raw(**{field.attr: value}), [1], [])
    try:
        a.procs.update_state(BatchUpdate(3, [], [add], []))
    except RequestError as e:
        assert e.index == 2 and e.field == field.name
        return
    assert dtype != torch.bool, "a bool tensor was read as a number"
    b.procs.update_state(BatchUpdate(3, [], [(2, _raw(**{field.attr: value.item()}), [1], [])], []))
    _same(a.state(), b.state())
