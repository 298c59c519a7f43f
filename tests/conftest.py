"""Shared pytest set-up."""

from __future__ import annotations

import _background
import pytest
import torch


def _engine_tests(session: pytest.Session):
    """``tests/test_vllm_engine.py`` if any of its tests was collected and selected."""
    for item in getattr(session, "items", []):
        if _is_engine_test(item):
            return item.module
    return None


def _is_engine_test(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return module is not None and module.__name__ == "test_vllm_engine"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-engine tests go last (their engines run in the background meanwhile, and the
    tests after them in file order would otherwise wait for those engines too); the ones that
    are soaks get their mark before ``-m`` selects."""
    engine = [i for i in items if _is_engine_test(i)]
    if engine:
        items[:] = [i for i in items if not _is_engine_test(i)] + engine
        engine[0].module.mark_soaks(engine)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the subprocess jobs (``_background.py``) and then the real-engine scenarios the
    selected tests need now, in the background, so they run while the other tests do
    (``test_vllm_engine.plan``)."""
    if session.config.option.collectonly:
        return
    _background.plan(session.items)
    module = _engine_tests(session)
    if module is not None:
        module.plan([i for i in session.items if getattr(i, "module", None) is module])


def pytest_sessionfinish(session: pytest.Session) -> None:
    _background.cancel_all()
    module = _engine_tests(session)
    if module is not None:
        module.stop_all()


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """The tests use small tensors on 2 shared cores, where torch's intra-op threads only spin
    against each other (elementwise ops ~30x slower under load): run them on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_llama() -> object:
    """A tiny random Llama (vocabulary 64) for HF `generate()` tests; no EOS."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
    ).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model
