"""``logitsproc_rs.hf`` in ``model.generate()`` on a tiny random Llama (no downloads): its
tokens equal a manual loop that runs the model and our native path (``build_logitsprocs`` +
``Sampler``), every feature at least once, per-row params, sampling rows, left padding, a new
generation starting fresh, and the rejections (beam search, bad per-row params)."""

from __future__ import annotations

import copy
import runpy
from pathlib import Path

import pytest
import torch
from _extras import import_extra
from _forkserver import run_python

from logitsproc_rs import (
    BatchUpdate,
    ConfigError,
    EngineConfig,
    Sampler,
    SamplingMetadata,
    SamplingParams,
    build_logitsprocs,
)
from logitsproc_rs.hf import HFLogitsProcessor, neutral_generate_kwargs

transformers = import_extra(
    "transformers", "transformers not installed (make extras, tests/extras/hf.sh)"
)

VOCAB = 1024
THINK_START, THINK_END = [900], [901, 902]
CFG = EngineConfig(reasoning_start_token_ids=THINK_START, reasoning_end_token_ids=THINK_END)
STEPS = 10


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    m = transformers.LlamaForCausalLM(cfg).eval()
    # No EOS stopping: every row runs STEPS tokens, so rows compare position by position.
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return m


def prompts(rows: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 800, (rows, length), generator=g)


def hf_generate(model, ids, proc=None, **kw) -> torch.Tensor:
    """Plain ``model.generate`` with our processor in the list (not the helper)."""
    procs = transformers.LogitsProcessorList([proc] if proc is not None else [])
    with torch.no_grad():
        out = model.generate(
            ids, logits_processor=procs, max_new_tokens=STEPS, do_sample=False, **kw
        )
    return out[:, ids.shape[1] :]


def manual_greedy(model, ids: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The model's forward with a KV cache, each step's last logits through our native path
    (the list feed: the pipeline re-reads the output lists), greedy."""
    rows = ids.shape[0]
    procs = build_logitsprocs(
        EngineConfig(
            max_num_seqs=rows,
            vocab_size=VOCAB,
            reasoning_start_token_ids=THINK_START,
            reasoning_end_token_ids=THINK_END,
        ),
        ids.device,
        ids.device.type == "cuda",
    )
    sampler = Sampler(procs)
    md = SamplingMetadata.from_params(params, VOCAB, ids.device)
    outs: list[list[int]] = [[] for _ in range(rows)]
    update = BatchUpdate(
        rows, [], [(i, p, ids[i].tolist(), outs[i]) for i, p in enumerate(params)], []
    )
    x, past = ids, None
    with torch.no_grad():
        for _ in range(STEPS):
            out = model(input_ids=x, past_key_values=past, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            procs.update_state(update)
            update = None
            tok = sampler(out.logits[:, -1].float(), md).sampled_token_ids
            for i, t in enumerate(tok.tolist()):
                outs[i].append(t)
            x = tok[:, None]
    return torch.tensor(outs, device=ids.device)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_feature_matches_the_native_path(model, device) -> None:
    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        model = copy.deepcopy(model).to(device)
    ids = prompts(8, 6, seed=1).to(device)
    ids[6, -1] = THINK_START[0]  # row 6 opens a thinking section in its prompt
    base = hf_generate(model, ids)
    b = base.tolist()
    allowed = list(range(100, 116))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logit_bias={777: 50.0, b[1][0]: -50.0}),
        SamplingParams(
            temperature=0.0,
            min_tokens=3,
            eos_token_id=5,
            stop_token_ids=[6],
            logit_bias={5: 50.0, 6: 40.0},
        ),
        SamplingParams(
            temperature=0.0, repetition_penalty=1.8, frequency_penalty=1.5, presence_penalty=1.0
        ),
        SamplingParams(temperature=0.0, bad_words_token_ids=[[b[4][0]], [b[4][1], b[4][2]]]),
        SamplingParams(temperature=0.0, allowed_token_ids=allowed),
        SamplingParams(temperature=0.0, thinking_token_budget=2),
        SamplingParams(
            temperature=0.0,
            logit_bias={b[7][0]: -3.0},
            repetition_penalty=1.3,
            bad_words_token_ids=[[b[7][1]]],
            min_tokens=2,
            stop_token_ids=[b[7][2]],
        ),
    ]
    proc = HFLogitsProcessor(params, engine_config=CFG)
    assert isinstance(proc, transformers.LogitsProcessor)
    ours = hf_generate(model, ids, proc)
    assert torch.equal(ours, manual_greedy(model, ids, params))

    o = ours.tolist()
    assert o[0] == b[0]  # no feature set: HF's own greedy
    assert o[1] == [777] * STEPS
    assert 5 not in o[2][:3] and 6 not in o[2][:3] and o[2][3] == 5
    assert o[3] != b[3]
    assert b[4][0] not in o[4] and o[4] != b[4]
    assert set(o[5]) <= set(allowed)
    assert o[6][2:4] == THINK_END and o[6] != b[6]
    assert o[7] != b[7]


def test_processor_changes_outputs(model) -> None:
    """Greedy rows with no feature set give HF's tokens; a bias gives others (so the
    comparison above can fail)."""
    ids = prompts(3, 5, seed=2)
    base = hf_generate(model, ids)
    plain = [SamplingParams(temperature=0.0)] * 3
    assert torch.equal(hf_generate(model, ids, HFLogitsProcessor(plain)), base)
    biased = [
        SamplingParams(temperature=0.0, logit_bias={int(base[i, 0]): -100.0}) for i in range(3)
    ]
    out = hf_generate(model, ids, HFLogitsProcessor(biased))
    assert (out[:, 0] != base[:, 0]).all()


def replay(raw: list[torch.Tensor], toks: torch.Tensor, prompts_: list[list[int]], params):
    """Our native path fed HF's raw logits and chosen tokens step by step (teacher forcing):
    the sampler's outputs per step."""
    rows = len(params)
    procs = build_logitsprocs(
        EngineConfig(
            max_num_seqs=rows,
            vocab_size=VOCAB,
            reasoning_start_token_ids=THINK_START,
            reasoning_end_token_ids=THINK_END,
        ),
        "cpu",
        False,
    )
    sampler = Sampler(procs)
    md = SamplingMetadata.from_params(params, VOCAB)
    outs: list[list[int]] = [[] for _ in range(rows)]
    update = BatchUpdate(rows, [], [(i, p, prompts_[i], outs[i]) for i, p in enumerate(params)], [])
    res = []
    for t, logits in enumerate(raw):
        procs.update_state(update)
        update = None
        res.append(sampler(logits.clone(), md))
        for i in range(rows):
            outs[i].append(int(toks[i, t]))
    return res


def test_sampling_rows_get_vllms_distribution(model) -> None:
    """do_sample=True with random rows (temperature, MinP, top-k, top-p) and a greedy row:
    HF's scores are exactly what our sampler samples from, greedy rows keep only vLLM's
    greedy token, and every token HF drew lies in that support."""
    ids = prompts(4, 6, seed=3)
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.5),
        SamplingParams(temperature=0.7, min_p=0.2, presence_penalty=0.5),
        SamplingParams(temperature=1.3, top_k=20, top_p=0.9, logit_bias={3: 2.0}),
        SamplingParams(temperature=1.0, min_p=0.05, allowed_token_ids=list(range(50, 300))),
    ]
    proc = HFLogitsProcessor(params, engine_config=CFG)
    torch.manual_seed(7)
    with torch.no_grad():
        res = proc.generate(
            model,
            ids,
            max_new_tokens=STEPS,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
        )
    toks = res.sequences[:, ids.shape[1] :]
    expect = replay(list(res.logits), toks, ids.tolist(), params)
    masked_by_min_p = 0
    for t, (scores, out) in enumerate(zip(res.scores, expect, strict=True)):
        assert torch.equal(scores[1:], out.logits[1:])  # random rows: the same distribution
        assert torch.isfinite(scores[0]).sum() == 1
        assert int(toks[0, t]) == int(out.sampled_token_ids[0])  # the greedy row
        assert torch.isfinite(scores[torch.arange(4), toks[:, t]]).all()
        masked_by_min_p += int(torch.isinf(scores[1]).sum())
    assert masked_by_min_p > 0
    assert set(toks[3].tolist()) <= set(range(50, 300))


def test_left_padding_uses_the_attention_mask(model) -> None:
    """A pad id equal to the thinking start marker: counted as prompt, it would open a
    thinking section and budget 0 would force the end marker at once."""
    pad = THINK_START[0]
    a, b = prompts(1, 6, seed=4)[0].tolist(), prompts(1, 3, seed=5)[0].tolist()
    ids = torch.tensor([a, [pad] * 3 + b])
    mask = torch.tensor([[1] * 6, [0] * 3 + [1] * 3])
    params = [SamplingParams(temperature=0.0, thinking_token_budget=0, repetition_penalty=1.4)] * 2
    kw = dict(
        max_new_tokens=STEPS, output_logits=True, return_dict_in_generate=True, pad_token_id=pad
    )
    with torch.no_grad():
        res = HFLogitsProcessor(params, engine_config=CFG).generate(model, ids, mask, **kw)
        unmasked = HFLogitsProcessor(params, engine_config=CFG).generate(
            model, ids, attention_mask=None, **kw
        )
    toks = res.sequences[:, ids.shape[1] :]
    expect = replay(list(res.logits), toks, [a, b], params)
    assert toks.tolist() == [[int(o.sampled_token_ids[i]) for o in expect] for i in range(2)]
    assert toks[1, :2].tolist() != THINK_END
    assert unmasked.sequences[1, ids.shape[1] : ids.shape[1] + 2].tolist() == THINK_END
    proc = HFLogitsProcessor(params, attention_mask=mask[:, 1:], engine_config=CFG)
    with pytest.raises(ValueError, match="attention_mask of shape"):
        hf_generate(model, ids, proc, attention_mask=mask)


def test_a_new_generate_starts_fresh(model) -> None:
    """Reusing one processor: each generation equals a fresh processor's, also when the new
    prompt is exactly one token longer than the last call saw (a different prompt), and when
    a generation's output is fed back after reset()."""
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=2.0)] * 2
    proc = HFLogitsProcessor(params)
    first = prompts(2, 4, seed=6)
    second = prompts(2, 4 + STEPS, seed=7)  # the last call of `first` saw 4 + STEPS - 1
    for ids in (first, second, first):
        assert torch.equal(
            hf_generate(model, ids, proc), hf_generate(model, ids, HFLogitsProcessor(params))
        )
    full = torch.cat([first, hf_generate(model, first, proc)], dim=1)
    with torch.no_grad():
        again = proc.generate(model, full, max_new_tokens=STEPS, do_sample=False)
    fresh = hf_generate(model, full, HFLogitsProcessor(params))
    assert torch.equal(again[:, full.shape[1] :], fresh)


def test_beam_search_and_bad_params_are_rejected(model) -> None:
    ids = prompts(2, 4, seed=8)
    params = [SamplingParams(temperature=0.0)] * 2
    with pytest.raises(ValueError, match="num_beams"):
        hf_generate(model, ids, HFLogitsProcessor(params), num_beams=2)
    with pytest.raises(ValueError, match=r"2 rows .* for 3 SamplingParams"):
        hf_generate(model, ids, HFLogitsProcessor(params + params[:1]))
    bad = [params[0], SamplingParams(temperature=0.0, logit_bias={VOCAB + 5: 1.0})]
    with pytest.raises(ValueError, match="row 1: field 'logit_bias'"):
        hf_generate(model, ids, HFLogitsProcessor(bad))
    with pytest.raises(ValueError, match="row 1: min_p must be in"):
        HFLogitsProcessor([{}, {"min_p": 2.0}])
    with pytest.raises(ValueError, match="row 0: thinking_token_budget is set"):
        HFLogitsProcessor([SamplingParams(thinking_token_budget=3)])
    with pytest.raises(ValueError, match="row 1: expected SamplingParams"):
        HFLogitsProcessor([params[0], 0.5])


def test_an_engine_config_mapping_is_taken_as_an_engine_config(model) -> None:
    """A plain mapping was stored as it was, and the first call raised TypeError from
    ``dataclasses.replace``; anything but an EngineConfig or a mapping is refused at once."""
    ids = prompts(2, 4, seed=9)
    params = [SamplingParams(temperature=0.0, thinking_token_budget=1)] * 2
    fields = {"reasoning_start_token_ids": THINK_START, "reasoning_end_token_ids": THINK_END}
    got = hf_generate(model, ids, HFLogitsProcessor(params, engine_config=fields))
    want = hf_generate(model, ids, HFLogitsProcessor(params, engine_config=CFG))
    assert torch.equal(got, want)
    with pytest.raises(ConfigError, match="unknown field"):
        HFLogitsProcessor(params, engine_config={"max_bad_wrods": 3})
    with pytest.raises(ConfigError, match="engine_config") as ei:
        HFLogitsProcessor(params, engine_config=[("max_bad_words", 3)])
    assert ei.value.field == "engine_config"


def test_neutral_kwargs_turn_off_hfs_own_processors(model) -> None:
    """A generation config with HF's own penalty and warpers: neutral_generate_kwargs() (what
    generate() passes) leaves only ours."""
    ids = prompts(2, 5, seed=9)
    params = [SamplingParams(temperature=0.0, presence_penalty=1.0)] * 2
    gc = transformers.GenerationConfig(
        repetition_penalty=3.0, no_repeat_ngram_size=1, pad_token_id=0
    )
    with torch.no_grad():
        plain = model.generate(
            ids,
            generation_config=gc,
            logits_processor=transformers.LogitsProcessorList([HFLogitsProcessor(params)]),
            max_new_tokens=STEPS,
            **neutral_generate_kwargs(do_sample=False),
        )
    assert torch.equal(plain[:, ids.shape[1] :], manual_greedy(model, ids, params))


def test_import_is_cheap() -> None:
    code = (
        "import sys; assert 'logitsproc_rs.hf' not in sys.modules;"
        " import logitsproc_rs.hf; print('transformers' in sys.modules)"
    )
    # A child of the fork server, which has imported torch and logitsproc_rs, not its hf module.
    out = run_python(code, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_example_runs(capsys) -> None:
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "hf_generate.py"))
    assert "row 2: " in capsys.readouterr().out
