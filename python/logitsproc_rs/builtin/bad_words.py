"""Bad words: ban a word's last token once the output ends with the rest of the word."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import RequestError
from ..views import Stage
from ._common import TripleView
from .min_tokens import _spec_apply


class BadWordsLogitsProcessor(TripleView):
    """Not argmax-invariant. Reads ``params.bad_words_token_ids`` (vLLM's tokenized bad words).

    Matching runs in Rust over the tails of the outputs, once per step.
    """

    TABLES = ("bad_words",)
    ARGMAX_INVARIANT = False
    STAGE = Stage.SAMPLER_BEFORE
    REFERENCE = "logitsproc_rs.reference:RefBadWordsLogitsProcessor"

    def apply_with_spec_decode(
        self,
        logits: torch.Tensor,
        num_draft_tokens: Sequence[int],
        spec_token_ids: Sequence[Sequence[int]],
    ) -> torch.Tensor:
        """Speculative decoding (vLLM ``apply_bad_words_with_drafts``): request ``r`` owns
        ``num_draft_tokens[r]`` rows; row ``j`` is matched against the output followed by
        ``spec_token_ids[r][:j]``."""
        pipe = self._pipe
        rows, n = pipe.core.spec_bad_words(list(num_draft_tokens), _draft_ids(spec_token_ids))
        return _spec_apply(pipe, "BadWordsLogitsProcessor", "spec.bad_words", logits, rows, n)


def _draft_ids(spec_token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """The draft tokens as lists of ints, or a ValueError naming the request and field."""
    out = []
    for r, ids in enumerate(spec_token_ids):
        try:
            row = list(ids)
        except TypeError:
            raise RequestError.located(
                r, "spec_token_ids", f"expected a list of token ids, got {ids!r}"
            ) from None
        for t in row:
            if isinstance(t, bool) or not isinstance(t, int):
                raise RequestError.located(
                    r, "spec_token_ids", f"expected int token ids, got {t!r}"
                )
        out.append(row)
    return out
