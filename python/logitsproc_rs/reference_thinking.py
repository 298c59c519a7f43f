"""Plain reference of the thinking budget (vLLM 0.25.1 ``thinking_budget_state.py``).

``ReferenceThinking`` is one request's state machine, rescanning the request's whole output on
every step (``_init_state_entry`` / ``_update_think_state`` / ``_apply_forcing_to_logits``, no
speculative tokens); ``RefThinkingBudgetLogitsProcessor`` keeps one per slot with the plain
``process_dict_updates`` bookkeeping (so a SWAP with one empty side moves the state, unlike
0.25.1, which duplicates it). The semantics are history-dependent, so a little state is
unavoidable:

* ``scan_offset``: the output length at which the last *forced* end sequence completed. Markers
  before it are never looked at again, and any start marker after it is force-closed at once.
* ``start_pos`` / ``end_pos``: vLLM records a marker position the first time a search finds one
  (the last occurrence in ``output[scan_offset:]`` at that step) and never searches for that
  marker again until a forced end completes.
* ``walk`` (vLLM's ``end_count``) and ``prev_len``: the walk advances by one end token per step
  in which the output grew, whatever was emitted (only the first end token is checked).

vLLM quirks kept on purpose: a multi-token start marker in the prompt allows ``len(start) - 1``
extra thinking tokens; an end marker seen before the start marker hides a later natural end;
after a natural end later thinking sections have no budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# The reference's own interface and bookkeeping; nothing of the pipeline it checks.
from .reference import ReferenceProcessor, check_outputs, process_dict_updates


def last_occurrence(seq: Sequence[int], pattern: Sequence[int], lo: int = 0) -> int:
    """Start index of the last occurrence of ``pattern`` in ``seq`` that starts at or after
    ``lo``; -1 if none (also for an empty pattern). Plain full scan."""
    k = len(pattern)
    if k == 0:
        return -1
    best = -1
    for i in range(max(0, lo), len(seq) - k + 1):
        if list(seq[i : i + k]) == list(pattern):
            best = i
    return best


def resolved_prefix(output: Sequence[int]) -> list[int]:
    """The output up to its first negative id. Async scheduling appends -1 placeholders that
    are replaced later; vLLM's holder only runs after that replacement, so a placeholder is
    treated as 'not generated yet' (a choice, see docs/semantics.md)."""
    out = []
    for t in output:
        if t < 0:
            break
        out.append(t)
    return out


class ReferenceThinking:
    """One request's thinking-budget state in vLLM 0.25.1 semantics (no spec decode)."""

    def __init__(
        self,
        prompt: Sequence[int] | None,
        budget: int | None,
        start_ids: Sequence[int],
        end_ids: Sequence[int],
    ):
        if budget is not None and budget < -1:
            raise ValueError("thinking_token_budget must be >= 0 or -1 (unlimited)")
        self.tracked = budget is not None and budget != -1
        self.budget: int = -1 if budget is None else budget  # -1: untracked
        self.start = list(start_ids)
        self.end = list(end_ids)
        ks = len(self.start)

        # Prompt scan (vLLM _init_state_entry, lines 189-248): the prompt is inside a thinking
        # section iff the last start marker begins after the last end marker.
        self.cont = False  # vLLM "continue_thinking": the first block began in the prompt
        self.prompt_think = 0  # vLLM's prompt share of think_count in later steps
        in_end = False
        if prompt is not None:
            last_start = last_occurrence(prompt, self.start)
            last_end = last_occurrence(prompt, self.end)
            if last_start > last_end:
                think_in_prompt = len(prompt) - (last_start + ks)  # tokens after the marker
                self.cont = True
                # vLLM stores start_thinking = last_start + ks - 1 and later counts
                # len(prompt) - (start_thinking + ks): ks - 1 fewer than at init (quirk Q1).
                self.prompt_think = think_in_prompt - (ks - 1)
                in_end = self.budget - think_in_prompt <= 0
        self.scan_offset = 0
        self.start_pos: int | None = -2 if self.cont else None  # -2: "in the prompt"
        self.end_pos: int | None = None
        self.walk: int | None = 0 if (self.tracked and in_end) else None
        self.prev_len = 0
        self.forced: int | None = None

    # ------------------------------------------------------------------------------------
    def _think_count(self, length: int) -> tuple[bool, int]:
        """(inside thinking?, thinking tokens) from the recorded marker positions."""
        ks = len(self.start)
        if self.cont:
            if self.end_pos is not None:
                return False, 0  # natural end in the output
            return True, length + self.prompt_think
        assert self.start_pos is not None and self.start_pos >= 0
        if self.end_pos is not None and self.start_pos <= self.end_pos:
            return False, 0  # ...<start>...<end>...: thinking ended naturally
        return True, length - (self.start_pos + ks)

    def step(self, output: Sequence[int]) -> int | None:
        """Advance by one engine step; return the token to force this step, or None."""
        self.forced = self._step(resolved_prefix(output))
        return self.forced

    def _step(self, out: list[int]) -> int | None:
        if not self.tracked or not self.end:
            self.walk = None  # empty end list: the row is disabled for good (lines 253-257)
            return None
        L = len(out)
        offset = self.scan_offset

        # 1. Start marker, searched only while none is recorded (lines 260-282).
        if self.start_pos is None:
            s = last_occurrence(out, self.start, offset)
            if s >= 0:
                self.start_pos = s
                if offset > 0:
                    # Re-entry after a forced end (lines 268-279, issue #43708): force-close at
                    # once, whatever the budget. The end search is skipped on this step.
                    self.walk = 0
                    return self.end[0]
        # 2. End marker, searched only while none is recorded (lines 283-293).
        if self.end_pos is None:
            e = last_occurrence(out, self.end, offset)
            if e >= 0:
                self.end_pos = e
        # 3. No start seen (and not inside thinking from the prompt): nothing to do (295-296).
        if self.start_pos is None:
            return None

        # 4. Forced-end walk (lines 325-352, 370-379, 452-483).
        if self.walk is not None:
            if L == 0 or self.prev_len >= L:
                return self.end[self.walk]  # no new token: force the same end token again
            new_tokens = out[self.prev_len : L]
            self.prev_len = L
            if self.walk == 0 and self.end[0] not in new_tokens:
                self.walk = None  # the first forced token did not come out: back to thinking
            else:
                self.walk += 1  # advances whatever was emitted
                if self.walk >= len(self.end):
                    # Forced end complete: forget the block, scan only what comes next.
                    self.walk = None
                    self.scan_offset = L
                    self.start_pos = None
                    self.end_pos = None
                    self.cont = False
                    return None
                return self.end[self.walk]

        # 5. Inside thinking and over budget: start forcing (lines 381-450, non-spec: the
        #    condition think_count + 0 + 1 > budget).
        self.prev_len = L
        inside, count = self._think_count(L)
        if inside and count + 1 > self.budget:
            self.walk = 0
            return self.end[0]
        return None


class RefThinkingBudgetLogitsProcessor(ReferenceProcessor):
    """Reference of ``ThinkingBudgetLogitsProcessor``: one ``ReferenceThinking`` per slot,
    stepped once per ``update_state``; ``apply`` writes 1e9 at each forced (row, token)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        reasoning = vllm_config.reasoning_config
        self.start = list(reasoning.reasoning_start_token_ids)
        self.end = list(reasoning.reasoning_end_token_ids)
        self.states: dict[int, tuple[ReferenceThinking, list[int]]] = {}
        self.forced: dict[int, int] = {}
        self.placeholders = False
        self.seen: dict[int, int] = {}
        self.batch_size = 0

    def is_argmax_invariant(self) -> bool:
        return False

    def _new_state(
        self, params: Any, prompt: list[int] | None, output: list[int]
    ) -> tuple[ReferenceThinking, list[int]] | None:
        budget = getattr(params, "thinking_token_budget", None)
        if budget is None or budget == -1:
            return None
        return ReferenceThinking(prompt, budget, self.start, self.end), output

    def update_state(self, batch_update: Any) -> None:
        check_outputs(batch_update, ((r, out) for r, (_ref, out) in self.states.items()))
        if batch_update is not None:
            process_dict_updates(self.states, batch_update, self._new_state)
            self.batch_size = batch_update.batch_size
        self.forced = {}
        self.placeholders = False
        self.seen = {}  # row -> usable output length at its last step
        for row, (ref, output) in self.states.items():
            if row < self.batch_size:
                self._step_row(row, ref, output)

    def _step_row(self, row: int, ref: ReferenceThinking, output: list[int]) -> None:
        usable = resolved_prefix(output)
        self.placeholders |= len(usable) < len(output)
        self.seen[row] = len(usable)
        tok = ref.step(output)
        if tok is None:
            self.forced.pop(row, None)
        else:
            self.forced[row] = tok

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.placeholders:
            # Outputs held async placeholders at update_state; the engine fills them in before
            # sampling, where vLLM's holder runs: step again the rows that can now read more.
            self.placeholders = False
            for row, (ref, output) in self.states.items():
                if row < self.batch_size and len(resolved_prefix(output)) > self.seen[row]:
                    self._step_row(row, ref, output)
        for row, tok in self.forced.items():
            logits[row, tok] = 1e9
        return logits
