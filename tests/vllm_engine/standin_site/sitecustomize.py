"""Triton's interpreter behind a stand-in CPU backend (``triton_standin``) in every Python that
starts with this folder on ``PYTHONPATH`` and ``LOGITSPROC_TRITON_STANDIN=1``: the worker
processes of a multi-process MRV2 engine (``driver.py``'s ``mrv2_tp2``), which import vLLM
before any code of ours could."""

import os

if os.environ.get("LOGITSPROC_TRITON_STANDIN") == "1":
    import triton_standin  # noqa: F401
