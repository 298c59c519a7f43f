"""Several pipelines in one ``LogitsProcessors`` container, and updates changed between the
processors of one step (issue 18):

- a container whose second pipeline refuses an update (another config, a column processor's
  reader, a token feed it cannot take, a KeyboardInterrupt from user code) leaves the first
  exactly as it was: every pipeline checks the update before any applies it;
- in vLLM's loop (each processor's ``update_state`` in turn) an update changed after the first
  processor ran the step (an added entry's params replaced, a removed index or a move changed,
  with the same sizes) is refused by the joining processors (``ProtocolError``), and they
  change nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from logitsproc_rs import (
    BatchUpdate,
    ColumnLogitsProcessor,
    EngineConfig,
    FloatColumn,
    LogitsProcessors,
    MoveDirectionality,
    ProtocolError,
    SamplingParams,
    build_logitsprocs,
)

V = 16
CFG = EngineConfig(max_num_seqs=4, vocab_size=V)
# A second pipeline with a smaller logit-bias cap: it refuses what the first takes.
TIGHT = EngineConfig(max_num_seqs=4, vocab_size=V, max_logit_bias_entries=1)
SWAP = MoveDirectionality.SWAP


class Scale(ColumnLogitsProcessor):
    """A column processor (its own pipeline): multiplies by ``extra_args["scale"]``."""

    COLUMNS = (
        FloatColumn("scale", default=1.0, read=lambda sp: (sp.extra_args or {}).get("scale")),
    )

    def is_argmax_invariant(self) -> bool:
        return False

    def transform(self, logits: torch.Tensor, cols: Any, num_active: int) -> torch.Tensor:
        return logits if not num_active else logits.mul_(cols["scale"])


def _seed_update() -> BatchUpdate:
    return BatchUpdate(
        2,
        [],
        [
            (0, SamplingParams(logit_bias={3: 1.5}, min_p=0.1, repetition_penalty=1.3), [1], [2]),
            (
                1,
                SamplingParams(min_tokens=3, stop_token_ids=[5], extra_args={"scale": 2.0}),
                [4],
                [],
            ),
        ],
        [],
    )


def _container(kind: str) -> LogitsProcessors:
    first = build_logitsprocs(CFG, "cpu", False)
    if kind == "tight":
        second: list[Any] = list(build_logitsprocs(TIGHT, "cpu", False).all)
    elif kind == "column":
        second = [Scale(CFG, "cpu", False)]
    elif kind == "column-first":
        first, second = LogitsProcessors([Scale(CFG, "cpu", False)]), list(first.all)
    elif kind == "emulated":
        second = list(build_logitsprocs(TIGHT, "cpu", False, emulate_device=True).all)
    else:
        raise AssertionError(kind)
    procs = LogitsProcessors([*first.all, *second])
    assert len(procs._pipelines) == 2
    procs.update_state(_seed_update())
    return procs


def _state(procs: LogitsProcessors) -> dict[str, Any]:
    """Every pipeline's status, counters and raw host buffers, and the container's logits."""
    out: dict[str, Any] = {}
    for k, pipe in enumerate(procs._pipelines):
        core = pipe.core
        out[f"{k}.status"] = (core.status(), list(pipe.status), core.batch_size, core.steps)
        out[f"{k}.active"] = core.active()
        out[f"{k}.buffers"] = [
            torch.from_dlpack(core.buffer(i)).clone() for i in range(len(core.sections()))
        ]
    rows = procs._pipelines[0].count("batch_size")
    x = torch.randn(rows, V, generator=torch.Generator().manual_seed(3))
    out["logits"] = procs.apply_each(procs.all, x)
    return out


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        elif k.endswith("buffers"):
            for x, y in zip(a[k], b[k], strict=True):
                assert torch.equal(x, y), k
        else:
            assert a[k] == b[k], k


def _follow_up() -> list[BatchUpdate | None]:
    return [
        None,
        BatchUpdate(
            3,
            [0],
            [(0, SamplingParams(logit_bias={7: -2.0}, presence_penalty=0.5), [3], [])],
            [(1, 2, SWAP)],
        ),
        None,
    ]


def _refused_by_second(kind: str) -> list[tuple[str, Any, type[BaseException]]]:
    """(name, update, exception) the second pipeline refuses; the first takes each."""
    valid = (2, SamplingParams(logit_bias={1: 1.0}), [1], [])
    cases: list[tuple[str, Any, type[BaseException]]] = []
    if kind in ("tight", "emulated"):
        two_biases = (3, SamplingParams(logit_bias={1: 1.0, 2: 2.0}), [1], [])
        cases.append(("cap", BatchUpdate(4, [], [valid, two_biases], [(0, 1, SWAP)]), ValueError))
    if kind == "column":
        bad_scale = (3, SamplingParams(extra_args={"scale": "big"}), [1], [])
        cases.append(("reader", BatchUpdate(4, [], [valid, bad_scale], [(0, 1, SWAP)]), ValueError))

    if kind == "column-first":

        class Interrupting:
            """A prompt whose ``__iter__`` raises: only the second pipeline (penalties) reads
            prompts."""

            def __iter__(self) -> Any:
                raise KeyboardInterrupt

        interrupt = (3, SamplingParams(repetition_penalty=1.2), Interrupting(), [])
        cases.append(
            ("interrupt", BatchUpdate(4, [], [valid, interrupt], [(0, 1, SWAP)]), KeyboardInterrupt)
        )
    return cases


KINDS = ["tight", "column", "column-first", "emulated"]
CASES = [(kind, *case) for kind in KINDS for case in _refused_by_second(kind)]


@pytest.mark.parametrize("kind,name,update,error", CASES, ids=[f"{k}-{n}" for k, n, *_ in CASES])
def test_second_pipeline_refusing_leaves_the_first_as_it_was(kind, name, update, error) -> None:
    procs, twin = _container(kind), _container(kind)
    before = _state(procs)
    with pytest.raises(error):
        procs.update_state(update)
    _assert_same(before, _state(procs))
    # Hidden state too: the same valid steps give what a container that never saw it gives.
    for u in _follow_up():
        procs.update_state(u)
        twin.update_state(u)
        _assert_same(_state(twin), _state(procs))


def test_a_token_feed_one_pipeline_cannot_take_changes_neither() -> None:
    fed = build_logitsprocs(CFG, "cpu", False, token_feed=True)
    listed = build_logitsprocs(TIGHT, "cpu", False)
    procs = LogitsProcessors([*fed.all, *listed.all])
    procs.update_state(_seed_update(), sampled_token_ids=None)
    before = _state(procs)
    with pytest.raises(ValueError, match="token_feed=True"):
        procs.update_state(None, sampled_token_ids=[3, 4])
    _assert_same(before, _state(procs))


def test_a_container_of_two_pipelines_steps_both() -> None:
    """The two-phase step gives what each pipeline's own step gives."""
    procs = _container("tight")
    a = build_logitsprocs(CFG, "cpu", False)
    b = build_logitsprocs(TIGHT, "cpu", False)
    for p in (a, b):
        p.update_state(_seed_update())
    for u in _follow_up():
        procs.update_state(u)
        a.update_state(u)
        b.update_state(u)
    x = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    want = b.apply_each(b.all, a.apply_each(a.all, x.clone()))
    assert torch.equal(procs.apply_each(procs.all, x.clone()), want)


def test_a_prepared_step_must_be_committed_or_aborted_first() -> None:
    pipe = build_logitsprocs(CFG, "cpu", False).pipeline
    assert pipe is not None
    pipe.prepare_step(_seed_update())
    with pytest.raises(ProtocolError):
        pipe.prepare_step(None)
    with pytest.raises(ProtocolError):
        pipe.core.step(None)
    pipe.abort_step()
    with pytest.raises(ProtocolError):
        pipe.commit_step()
    pipe.step(_seed_update())


# --- an update changed between the processors of one step -----------------------------------


def _vllm_loop() -> tuple[list[Any], list[list[int]]]:
    procs = list(build_logitsprocs(CFG, "cpu", False).all)
    outs: list[list[int]] = [[2], []]
    seed = BatchUpdate(
        2,
        [],
        [
            (0, SamplingParams(logit_bias={3: 1.5}, repetition_penalty=1.3), [1], outs[0]),
            (1, SamplingParams(min_tokens=3, stop_token_ids=[5]), [4], outs[1]),
        ],
        [],
    )
    for p in procs:
        p.update_state(seed)
    return procs, outs


def _update() -> BatchUpdate:
    return BatchUpdate(
        3,
        [1],
        [
            (1, SamplingParams(logit_bias={4: 2.0}), [3], []),
            (2, SamplingParams(min_p=0.2), [2], []),
        ],
        [(0, 2, SWAP)],
    )


def _replace_params(u: BatchUpdate) -> None:
    i, _, prompt, out = u.added[0]
    u.added[0] = (i, SamplingParams(logit_bias={4: -9.0}), prompt, out)


def _replace_params_reusing_ids(u: BatchUpdate) -> None:
    """Drop the entry first, then add a same-shaped one: the new objects could take the freed
    objects' ids, were they not held."""
    i, _, _, _ = u.added.pop(0)
    u.added.insert(0, (i, SamplingParams(logit_bias={4: -9.0}), [3], []))


def _change_removed(u: BatchUpdate) -> None:
    u.removed[0] = 3


def _change_move(u: BatchUpdate) -> None:
    u.moved[0] = (0, 2, MoveDirectionality.UNIDIRECTIONAL)


def _change_index(u: BatchUpdate) -> None:
    _, p, prompt, out = u.added[1]
    u.added[1] = (3, p, prompt, out)


def _replace_prompt(u: BatchUpdate) -> None:
    i, p, _, out = u.added[0]
    u.added[0] = (i, p, [3, 3], out)


def _grow_prompt_in_place(u: BatchUpdate) -> None:
    u.added[0][2].append(7)


MUTATIONS = {
    f.__name__.lstrip("_"): f
    for f in (
        _replace_params,
        _replace_params_reusing_ids,
        _change_removed,
        _change_move,
        _change_index,
        _replace_prompt,
        _grow_prompt_in_place,
    )
}


@pytest.mark.parametrize("mutate", list(MUTATIONS.values()), ids=list(MUTATIONS))
def test_an_update_changed_between_processors_is_refused_by_the_joiners(mutate) -> None:
    procs, _ = _vllm_loop()
    u = _update()
    procs[0].update_state(u)
    pipe = procs[0].pipeline
    before = (pipe.core.status(), list(pipe.status), pipe.core.steps, pipe.core.active())
    mutate(u)
    for p in procs[1:]:
        with pytest.raises((ProtocolError, ValueError), match=r"different batch updates|changed"):
            p.update_state(u)
    assert before == (pipe.core.status(), list(pipe.status), pipe.core.steps, pipe.core.active())


def test_an_unchanged_update_joins() -> None:
    procs, outs = _vllm_loop()
    u = _update()
    for p in procs:
        p.update_state(u)
    outs[0].append(9)
    for p in procs:
        p.update_state(None)


def test_a_params_object_changed_in_place_is_not_seen() -> None:
    """Documented limit: the fingerprint holds identities, not the params' fields."""
    procs, _ = _vllm_loop()
    u = _update()
    procs[0].update_state(u)
    params = u.added[0][1]
    object.__setattr__(params, "logit_bias", {5: 1.0})
    for p in procs[1:]:
        p.update_state(u)


def test_a_duck_typed_update_changed_in_place_is_refused() -> None:
    procs, _ = _vllm_loop()
    u = SimpleNamespace(batch_size=3, removed=[1], added=[(1, SamplingParams(), [3], [])], moved=[])
    procs[0].update_state(u)
    u.removed = [2]
    with pytest.raises(ProtocolError):
        procs[1].update_state(u)
