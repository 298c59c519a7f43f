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

from collections.abc import Mapping
from typing import Any

from ..errors import RequestError
from ..params import SamplingParams
from ..registry import FIELD_TABLE as REGISTRY_FIELD_TABLE

NAMESPACE = "logitsproc_rs"

# The fields our built-in tables read and the table that reads each, by the name the core
# gives it in its errors and by its SamplingParams attribute (the core's registry). The errors'
# ``processor`` is read here (``logitsproc_rs.errors``).
FIELD_TABLE = REGISTRY_FIELD_TABLE
# What a request may put in extra_args["logitsproc_rs"]: vLLM's names of those fields.
NAMESPACE_FIELDS = frozenset(FIELD_TABLE) - {"all_stop_token_ids", "bad_words"}
_NEUTRAL = SamplingParams(max_tokens=None)


class Routed:
    """A request's parameters as our tables read them in namespace mode: the built-in fields
    from ``extra_args[namespace]``, everything else (``extra_args`` for columns) from the
    request itself."""

    __slots__ = ("_ours", "_request", "all_stop_token_ids")

    def __init__(self, request: Any, ours: SamplingParams) -> None:
        self._request = request
        self._ours = ours
        # vLLM stops the request on its own stop ids and EOS anyway: MinTokens holds those
        # back, plus any extra ones the namespace names. Only a request with our min_tokens
        # has any (a plain request's own stop ids are vLLM's business, and not capped by us).
        self.all_stop_token_ids: set[int] = set()
        if ours.min_tokens:
            own = getattr(request, "all_stop_token_ids", None) or ()
            self.all_stop_token_ids = set(ours.stop_token_ids or ()) | set(own)

    def __getattr__(self, name: str) -> Any:
        if name in FIELD_TABLE:
            return getattr(self._ours, name)
        return getattr(self._request, name)


def routed_params(index: int | None, request: Any, namespace: str) -> SamplingParams:
    """Our checked ``SamplingParams`` from ``request.extra_args[namespace]`` (neutral when
    unset). A bad value is a ``RequestError`` naming the request and the field."""
    extra = getattr(request, "extra_args", None)
    ns = extra.get(namespace) if isinstance(extra, Mapping) else None
    if ns is None:
        return _NEUTRAL
    field = f"extra_args[{namespace!r}]"
    if not isinstance(ns, Mapping):
        raise RequestError.located(
            index, field, f"expected a dict of sampling fields, got {type(ns).__name__}"
        )
    unknown = sorted(str(k) for k in ns if k not in NAMESPACE_FIELDS)
    if unknown:
        raise RequestError.located(
            index,
            field,
            f"unknown field(s) {unknown}; expected some of {sorted(NAMESPACE_FIELDS)}",
        )
    try:
        return SamplingParams(max_tokens=None, **ns)
    except ValueError as e:
        # The error names the sampling field (``field``), and so does ours, inside the
        # namespace: "field 'extra_args['logitsproc_rs']['min_p']'".
        key = getattr(e, "field", None)
        if isinstance(key, str) and key in ns:
            raise RequestError.located(index, key, str(e), label=f"{field}[{key!r}]") from e
        raise RequestError.located(index, field, str(e)) from e
