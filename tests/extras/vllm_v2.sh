#!/usr/bin/env bash
# vLLM 0.33.0's own modules for tests/test_vllm_v2.py (Model Runner V2's logits-processor
# interface and loader). Idempotent. The wheel goes into its own --target folder with --no-deps
# (never a second torch; 0.25.1 lives in a folder of its own), and tests import it only in
# subprocesses with PYTHONPATH=<that folder>. Every pip call holds the shared lock: other
# scripts install into the same venv concurrently.
#
# Nothing goes into the venv: what the tests import from vLLM (the MRV2 logits-processor
# interface and loader, vllm.logger, vllm.envs, vllm.exceptions, vllm.utils.torch_utils) needs
# only torch and numpy. vllm.sampling_params would pull in vllm.config (aiohttp, zmq,
# transformers, ...); the tests shim the one module that imports it (tests/vllm_drivers/
# v2_harness.py) and use our duck-typed SamplingParams instead.
set -euo pipefail
source "$(dirname "$0")/_pip.sh"
TARGET="$CACHE/vllm-0.33.0"

target_install vllm==0.33.0 "$TARGET" vllm/v1/worker/gpu/sample/logits_processor/interface.py
