"""Bad input to our V1 bridges (``logitsproc_rs.vllm.v1``) inside vLLM 0.25.1's
``build_logitsprocs`` and loop, each case against a twin engine that never saw it:

- request fields that are no number (an int too large for a float, a bool), namespaced and
  ordinary (``namespace=None``): a ``RequestError`` naming the field at vLLM's front end
  (``validate_params``); in the worker the request is failed closed and the rest goes on;
- an update that is malformed (a bool move direction, a slot beyond the batch): raises,
  naming the processor, and every table is exactly as the twin's, as are the next steps.

Prints one ``RESULT {json}`` line (run by tests/bad_input/test_v1_bridge.py).
"""

from __future__ import annotations

import logging
from typing import Any

import log_records
import torch
import v1_harness  # noqa: F401  (paths, threads)
from v1_harness import import_vllm, result

from logitsproc_rs import EngineConfig
from logitsproc_rs.registry import TABLES
from logitsproc_rs.vllm import v1

lp = import_vllm()
from vllm.sampling_params import SamplingParams as VllmSamplingParams  # noqa: E402

V = 32
PLAIN = [
    v1.bridge(c.VIEW, name=f"Plain{c.__name__}", namespace=None)
    for c in (v1.MinPLogitsProcessor, v1.LogitBiasLogitsProcessor, v1.PenaltiesLogitsProcessor)
]
ROUTED = [v1.MinPLogitsProcessor, v1.LogitBiasLogitsProcessor, v1.PenaltiesLogitsProcessor]


class Params:
    """vLLM's params with one field replaced (what vLLM's own class would check itself)."""

    def __init__(self, base: Any, **fields: Any) -> None:
        self._base = base
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        if name in self._fields:
            return self._fields[name]
        return getattr(self._base, name)


def request(mode: str, **fields: Any) -> Any:
    if mode == "routed":
        return VllmSamplingParams(extra_args={v1.NAMESPACE: fields} if fields else None)
    plain = {k: v for k, v in fields.items() if isinstance(v, float) and k != "logit_bias"}
    rest = {k: v for k, v in fields.items() if k not in plain}
    return Params(VllmSamplingParams(**plain), **rest)


class Engine:
    """vLLM's build_logitsprocs with our bridges (``mode``: routed or plain fields) and three
    requests in flight. Only our bridges are stepped and applied (vLLM's own built-ins, which
    its build adds, read the plain fields too, and are not under test)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        cfg = EngineConfig(max_num_seqs=8, vocab_size=V)  # its own: its own group
        classes = ROUTED if mode == "routed" else PLAIN
        self.procs = lp.build_logitsprocs(cfg, torch.device("cpu"), False, False, classes)
        self.bridges = [p for p in self.procs.all if isinstance(p, v1._Bridge)]
        self.outputs: list[list[int]] = [[] for _ in range(8)]
        self.builder = lp.BatchUpdateBuilder()
        self.n = 0
        self.step(
            [
                (0, request(mode, min_p=0.2, logit_bias={5: 3.0})),
                (1, request(mode, repetition_penalty=1.5)),
                (2, request(mode, presence_penalty=1.0, logit_bias={7: -2.0})),
            ],
            size=3,
        )
        for i in range(3):
            self.outputs[i].extend([5, 9, i])

    def step(self, adds: list, removed: tuple = (), size: int | None = None) -> None:
        for i in removed:
            self.builder.removed_append(i)
        for i, sp in adds:
            self.builder.added.append((i, sp, [1, 2], self.outputs[i]))
        self.n = self.n if size is None else size
        update = self.builder.get_and_reset(self.n)
        for p in self.bridges:
            p.update_state(update)

    def logits(self, seed: int) -> torch.Tensor:
        x = torch.randn(self.n, V, generator=torch.Generator().manual_seed(seed)) * 3
        for invariant in (False, True):
            for p in self.bridges:
                if p.is_argmax_invariant() == invariant:
                    x = p.apply(x)
        return x

    def state(self) -> Any:
        g = self.bridges[0]._group
        core = g.pipeline.core
        bufs = [torch.from_dlpack(core.buffer(i)).clone() for i in range(len(core.sections()))]
        return [
            dict(core.active()),
            core.status(),
            list(g.pipeline.status),
            dict(g.forced.rows),
        ], bufs


def same(a: Any, b: Any) -> bool:
    return a[0] == b[0] and all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))


def described(e: BaseException | None) -> dict[str, Any]:
    if e is None:
        return {"raised": None}
    return {
        "raised": type(e).__name__,
        "mro": [c.__name__ for c in type(e).__mro__],
        "field": getattr(e, "field", None),
        "message": str(e)[:300],
    }


NOT_NUMBERS = [
    ("min_p", 10**400),
    ("min_p", True),
    ("presence_penalty", -(10**400)),
    ("frequency_penalty", True),
    ("repetition_penalty", 10**400),
    ("logit_bias", {3: 10**400}),
    ("logit_bias", {3: True}),
]
# Every float field of the core's registry, through the namespace only (the plain bridges here
# read MinP's, LogitBias's and the penalties' fields): the new ones escaped as OverflowError.
ROUTED_ONLY = [
    (f, 10**400)
    for f in dict.fromkeys(f.attr for t in TABLES.values() for f in t.fields if f.kind == "float")
]


# Fields of processors these engines did not load (MinP, LogitBias and the penalties are):
# each switches its processor on, so the request is failed closed, never run without it.
UNBUILT = [
    ("no_repeat_ngram_size", 2),
    ("dry_multiplier", 0.8),
    ("xtc_probability", 0.5),
    ("top_n_sigma", 1.0),
    ("typical_p", 0.5),
    ("min_tokens", 3),
    ("allowed_token_ids", [1, 2]),
    ("bad_words_token_ids", [[4]]),
]
# Fields that only tune a processor (set alone they change nothing): served as they are.
TUNING_ONLY = [("dry_base", 2.0), ("xtc_threshold", 0.3), ("no_repeat_ngram_window", 4)]


EVERY_FIELD = [v1.EveryFieldLogitsProcessor, v1.EveryFieldSamplingLogitsProcessor]


def unbuilt(out: dict[str, Any]) -> None:
    """Namespaced fields of processors the engine did not load: at vLLM's front end (its own
    ``validate_logits_processors_parameters`` over the loaded classes: ``ROUTED``, and the
    every-field classes, which load them all) and in the worker."""
    for field, value in UNBUILT + TUNING_ONLY:
        for name, classes in (("front", ROUTED), ("front_every_field", EVERY_FIELD)):
            try:
                lp.validate_logits_processors_parameters(
                    classes, request("routed", **{field: value})
                )
                out[f"{name}[{field}]"] = {"raised": None}
            except BaseException as e:
                out[f"{name}[{field}]"] = described(e)
        eng, twin = Engine("routed"), Engine("routed")
        error = None
        with log_records.only_errors() as logged:
            try:
                eng.step([(3, request("routed", **{field: value}))], size=4)
            except BaseException as e:
                error = e
        twin.step([(3, request("routed"))], size=4)
        r = described(error)
        r["forced"] = sorted(eng.bridges[0]._group.forced.rows)
        r["logged"] = logged.messages
        r["same"] = torch.equal(eng.logits(1), twin.logits(1))
        out[f"unbuilt[{field}]"] = r


def main() -> None:
    logging.getLogger("logitsproc_rs").setLevel(logging.CRITICAL)  # failed-closed requests
    out: dict[str, Any] = {}
    unbuilt(out)
    for mode in ("routed", "plain"):
        for field, value in NOT_NUMBERS + (ROUTED_ONLY if mode == "routed" else []):
            key = f"{mode}:{field}={str(value)[:12]}"
            sp = request(mode, **{field: value})
            if mode == "routed":
                try:
                    cls = v1.LogitBiasLogitsProcessor if field == "logit_bias" else ROUTED[0]
                    cls.validate_params(sp)
                    out[f"validate_params[{key}]"] = {"raised": None}
                except BaseException as e:
                    out[f"validate_params[{key}]"] = described(e)
            # The worker: failed closed, the others untouched; re-admitted fixed, as the twin.
            eng, twin = Engine(mode), Engine(mode)
            error = None
            try:
                eng.step([(3, sp)], size=4)
            except BaseException as e:
                error = e
            twin.step([(3, request(mode))], size=4)
            r = described(error)
            r["forced"] = sorted(eng.bridges[0]._group.forced.rows)
            a, b = eng.logits(1), twin.logits(1)
            r["others_same"] = torch.equal(a[:3], b[:3])
            for e in (eng, twin):
                e.step([(3, request(mode, min_p=0.3))])
            r["same_after"] = same(eng.state(), twin.state()) and torch.equal(
                eng.logits(2), twin.logits(2)
            )
            out[f"update[{key}]"] = r

        # Malformed updates: raise naming the processor; nothing changed.
        for name, update in {
            "bool_direction": lambda e: lp.BatchUpdate(3, [], [], [(0, 2, True)]),
            "int_direction": lambda e: lp.BatchUpdate(3, [], [], [(0, 2, 3)]),
            "slot_beyond": lambda e: lp.BatchUpdate(
                3, [], [(1, request(e.mode, min_p=0.5), [1], e.outputs[1]), (9, None, [], [])], []
            ),
            "bool_slot": lambda e: lp.BatchUpdate(3, [True], [], []),
            "batch_size_bool": lambda e: lp.BatchUpdate(True, [], [], []),
        }.items():
            eng, twin = Engine(mode), Engine(mode)
            before = eng.state()
            error = None
            try:
                bad = update(eng)
                for p in eng.bridges:
                    p.update_state(bad)
            except BaseException as e:
                error = e
            r = described(error)
            r["same_state"] = same(before, eng.state()) and same(twin.state(), eng.state())
            for e in (eng, twin):
                e.outputs[0].append(4)
                e.step([(1, request(mode, frequency_penalty=0.5))])
            r["same_after"] = same(eng.state(), twin.state()) and torch.equal(
                eng.logits(3), twin.logits(3)
            )
            out[f"{mode}:{name}"] = r
    result(**out)


if __name__ == "__main__":
    main()
