#!/usr/bin/env bash
# vLLM 0.25.1's own modules for tests/test_vllm_v1.py (its V1 logits-processor interface,
# build_logitsprocs, BatchUpdateBuilder, SamplingParams). Idempotent. The wheel goes into its
# own --target folder with --no-deps (never a second torch; 0.33.0 lives in a folder of its
# own), and tests import it only in subprocesses with PYTHONPATH=<that folder>. What importing
# those modules needs besides is installed into the venv under a constraint pinning its torch.
set -euo pipefail
source "$(dirname "$0")/_pip.sh"
TARGET="$CACHE/vllm-0.25.1"
# The same transformers as tests/extras/hf.sh (vLLM 0.25.1 asks for >= 5.5.3).
TRANSFORMERS=5.23.0
# What `import vllm.v1.sample.logits_processor, vllm.sampling_params, vllm.config` imports,
# with vLLM 0.25.1's own version bounds: all light, pure Python or small wheels.
DEPS=(regex msgspec cbor2 psutil "pyzmq>=25.0.0" "aiohttp>=3.13.3" "requests>=2.26.0"
      "openai>=2.0.0" "openai-harmony>=0.0.3" cloudpickle pybase64 cachetools uvloop
      py-cpuinfo "transformers==$TRANSFORMERS")

target_install vllm==0.25.1 "$TARGET" vllm/v1/sample/logits_processor/interface.py

imports_ok() {
    PYTHONPATH="$TARGET" "$PY" -c \
        "import vllm.v1.sample.logits_processor, vllm.sampling_params, vllm.config" "$@"
}
imports_ok 2>/dev/null && exit 0
pip_keep_torch "${DEPS[@]}"
if ! imports_ok; then
    echo "vllm_v1.sh: vLLM 0.25.1's modules still do not import (above)" >&2
    exit 1
fi
