"""Where the bridged built-ins read their fields: vLLM's own names, from a namespace in
``extra_args`` (``extra_args["logitsproc_rs"]``) by default.

vLLM applies MinTokens, LogitBias, MinP, allowed ids, bad words, penalties and the thinking
budget itself, from the request's ordinary fields, in V1 (0.25.1) and in Model Runner V2
alike, and none of them can be switched off. Reading the same fields would apply them twice,
so our bridges read theirs from the namespace: each request gets ours or vLLM's, never both.
A bridge built with ``namespace=None`` reads the ordinary fields (for an engine that does not
apply them itself). Shared by ``v1`` and ``v2``; imports no vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..errors import RequestError
from ..params import SamplingParams
from ..registry import FIELD_TABLE as REGISTRY_FIELD_TABLE
from ..registry import TABLES

NAMESPACE = "logitsproc_rs"

# The fields our built-in tables read and the table that reads each, by the name the core
# gives it in its errors and by its SamplingParams attribute (the core's registry). The errors'
# ``processor`` is read here (``logitsproc_rs.errors``).
FIELD_TABLE = REGISTRY_FIELD_TABLE
# What a request may put in extra_args["logitsproc_rs"]: vLLM's names of those fields.
NAMESPACE_FIELDS = frozenset(FIELD_TABLE) - {"all_stop_token_ids", "bad_words"}
_NEUTRAL = SamplingParams(max_tokens=None)
# The bool fields, by attribute: vLLM's ``vllm_xargs`` schema turns a JSON ``true`` into 1, so
# the wire form reads the int 0 or 1 there as the bool it was.
_BOOL_FIELDS = frozenset(f.attr for t in TABLES.values() for f in t.fields if f.kind == "bool")


class Routed:
    """A request's parameters as our tables read them in namespace mode: the built-in fields
    from ``extra_args[namespace]``, everything else (``extra_args`` for columns) from the
    request itself."""

    __slots__ = ("_ours", "_request", "all_stop_token_ids")

    def __init__(self, request: Any, ours: SamplingParams) -> None:
        self._request = request
        self._ours = ours
        # vLLM stops the request on its own stop ids and EOS anyway: MinTokens holds those
        # back, plus any extra ones the namespace names. The request's own join only with our
        # min_tokens (a plain request's own stop ids are vLLM's business, and not capped by
        # us); the namespace's are always given, so that their cap holds either way.
        self.all_stop_token_ids: set[int] = set(ours.stop_token_ids or ())
        if ours.min_tokens:
            own = getattr(request, "all_stop_token_ids", None) or ()
            self.all_stop_token_ids |= set(own)

    def __getattr__(self, name: str) -> Any:
        if name in FIELD_TABLE:
            return getattr(self._ours, name)
        return getattr(self._request, name)


class Namespaced(NamedTuple):
    """A request's namespaced fields, read: our checked ``SamplingParams`` and how an error
    names one of its fields (``label("min_p")``), in the form the request used."""

    params: SamplingParams
    label: Callable[[str], str]


def wire_key(namespace: str, name: str) -> str:
    """The flat ``extra_args`` key of field ``name`` (``"logitsproc_rs.min_p"``)."""
    return f"{namespace}.{name}"


def to_wire(fields: Mapping[str, Any], namespace: str = NAMESPACE) -> dict[str, Any]:
    """``fields`` (the Python form's dict: vLLM's names) in the wire form, for ``vllm_xargs``
    over HTTP: a flat key per field, a number as itself, anything else (a list, ``logit_bias``,
    a bool, ``None``) as JSON text. vLLM's schema for ``vllm_xargs`` is ``str | int | float``
    in 0.25.1 (``| list[str | int | float]`` in 0.32), so this form passes both."""

    def plain(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return {wire_key(namespace, k): v if plain(v) else json.dumps(v) for k, v in fields.items()}


def dict_label(namespace: str = NAMESPACE) -> Callable[[str], str]:
    """How an error names a field given in the Python form: ``extra_args['ns']['min_p']``."""
    return lambda name: f"extra_args[{namespace!r}][{name!r}]"


def wire_label(namespace: str = NAMESPACE) -> Callable[[str], str]:
    """How an error names a field given in the wire form: ``extra_args['ns.min_p']``."""
    return lambda name: f"extra_args[{wire_key(namespace, name)!r}]"


def _wire_fields(
    index: int | None, extra: Mapping[Any, Any], namespace: str
) -> dict[str, Any] | None:
    """The fields given in the wire form (flat ``"<namespace>.<field>"`` keys), decoded: a
    string is JSON text, anything else the value itself (for a bool field, 0 and 1 are the
    bools vLLM's schema made them). ``None`` when there are none."""
    prefix = wire_key(namespace, "")
    keys = [k for k in extra if isinstance(k, str) and k.startswith(prefix)]
    if not keys:
        return None
    fields: dict[str, Any] = {}
    for key in keys:
        value = extra[key]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as e:
                # RecursionError: JSON nested deeper than the parser's stack; over HTTP that
                # is a bad request like any other, never an escape from vLLM's front end.
                detail = str(e) if isinstance(e, ValueError) else "nested too deeply"
                raise RequestError.located(
                    index,
                    key[len(prefix) :],
                    f"a string here is JSON text, and {value[:40]!r} is not: {detail}",
                    label=wire_label(namespace)(key[len(prefix) :]),
                ) from None
        name = key[len(prefix) :]
        if name in _BOOL_FIELDS and type(value) is int and value in (0, 1):
            value = bool(value)
        fields[name] = value
    return fields


def read_namespace(index: int | None, request: Any, namespace: str) -> Namespaced:
    """Our checked ``SamplingParams`` from ``request.extra_args``, in either form (neutral
    when neither is there):

    - the Python form: ``extra_args[namespace]``, a dict of fields by vLLM's names;
    - the wire form, which vLLM's HTTP schema for ``vllm_xargs`` accepts: a flat key per
      field, ``extra_args[f"{namespace}.{name}"]``, whose value is the field's value when
      it is a number or a flat list of numbers, or JSON text (a string) for any value.

    A request uses one form. A bad value is a ``RequestError`` naming the request and the
    field, as the request wrote it."""
    extra = getattr(request, "extra_args", None)
    if not isinstance(extra, Mapping):
        return Namespaced(_NEUTRAL, dict_label(namespace))
    ns = extra.get(namespace)
    wire = _wire_fields(index, extra, namespace)
    if ns is None and wire is None:
        return Namespaced(_NEUTRAL, dict_label(namespace))
    if wire is not None:
        if ns is not None:
            raise RequestError.located(
                index,
                f"extra_args[{namespace!r}]",
                f"give our fields either as this dict or as {wire_key(namespace, '<field>')!r} "
                "keys, not both",
            )

        label = wire_label(namespace)
        return Namespaced(_checked(index, wire, label, None), label)
    field = f"extra_args[{namespace!r}]"
    nested = dict_label(namespace)
    if not isinstance(ns, Mapping):
        raise RequestError.located(
            index,
            field,
            f"expected a dict of sampling fields (or {wire_key(namespace, '<field>')!r} keys), "
            f"got {type(ns).__name__}",
        )
    return Namespaced(_checked(index, ns, nested, field), nested)


def _checked(
    index: int | None, fields: Mapping[Any, Any], label: Callable[[str], str], where: str | None
) -> SamplingParams:
    """``fields`` as our ``SamplingParams``; unknown names and bad values are
    ``RequestError``s naming the field by ``label`` (``where``: the whole of them; ``None``
    for flat keys, where one unknown key is named by itself, several by ``extra_args``)."""
    unknown = sorted(str(k) for k in fields if k not in NAMESPACE_FIELDS)
    if unknown:
        if where is None:
            where = label(unknown[0]) if len(unknown) == 1 else "extra_args"
        raise RequestError.located(
            index,
            where,
            f"unknown field(s) {unknown}; expected some of {sorted(NAMESPACE_FIELDS)}",
        )
    try:
        return SamplingParams(max_tokens=None, **fields)
    except ValueError as e:
        # The error names the sampling field (``field``), and so does ours, as the request
        # wrote it: "field 'extra_args['logitsproc_rs']['min_p']'".
        key = getattr(e, "field", None)
        if isinstance(key, str) and key in fields:
            raise RequestError.located(index, key, str(e), label=label(key)) from e
        raise RequestError.located(index, where or "extra_args", str(e)) from e


def routed_params(index: int | None, request: Any, namespace: str) -> SamplingParams:
    """Our checked ``SamplingParams`` from ``request.extra_args`` (``read_namespace``)."""
    return read_namespace(index, request, namespace).params
