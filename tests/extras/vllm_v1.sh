#!/usr/bin/env bash
# vLLM 0.25.1's own modules for tests/test_vllm_v1.py (its V1 logits-processor interface,
# build_logitsprocs, BatchUpdateBuilder, SamplingParams). Idempotent. The wheel goes into its
# own --target folder with --no-deps (never a second torch; 0.33.0 lives in a folder of its
# own), and tests import it only in subprocesses with PYTHONPATH=<that folder>. What importing
# those modules needs besides is installed into the venv under a constraint pinning the venv's
# torch. Every pip call holds the shared lock: other scripts install into the same venv.
set -euo pipefail
: "${VENV:=$HOME/.cache/logitsproc_rs/venv}"
: "${PY:=$VENV/bin/python}"
CACHE="$HOME/.cache/logitsproc_rs"
TARGET="$CACHE/vllm-0.25.1"
LOCK="$CACHE/pip.lock"
TORCH=2.15.0
# The same transformers as tests/extras/hf.sh (vLLM 0.25.1 asks for >= 5.5.3).
TRANSFORMERS=5.23.0
# What `import vllm.v1.sample.logits_processor, vllm.sampling_params, vllm.config` imports,
# with vLLM 0.25.1's own version bounds: all light, pure Python or small wheels.
DEPS=(regex msgspec cbor2 psutil "pyzmq>=25.0.0" "aiohttp>=3.13.3" "requests>=2.26.0"
      "openai>=2.0.0" "openai-harmony>=0.0.3" cloudpickle pybase64 cachetools uvloop
      py-cpuinfo "transformers==$TRANSFORMERS")
mkdir -p "$CACHE"

if [ ! -f "$TARGET/vllm/v1/sample/logits_processor/interface.py" ]; then
    rm -rf "$TARGET.partial"
    flock "$LOCK" "$PY" -m pip install -q --no-deps --no-compile \
        --target "$TARGET.partial" vllm==0.25.1
    rm -rf "$TARGET"
    mv "$TARGET.partial" "$TARGET"  # only a complete install counts as installed
fi

imports_ok() {
    PYTHONPATH="$TARGET" "$PY" -c \
        "import vllm.v1.sample.logits_processor, vllm.sampling_params, vllm.config" \
        >/dev/null 2>&1
}
if imports_ok; then
    exit 0
fi
torch_before=$("$PY" -c "import torch; print(torch.__version__)")
case "$torch_before" in
    "$TORCH" | "$TORCH"+*) ;;
    *) echo "vllm_v1.sh: the venv has torch '$torch_before', expected $TORCH" >&2; exit 1 ;;
esac
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_before" >"$constraints"
flock "$LOCK" "$PY" -m pip install -q -c "$constraints" "${DEPS[@]}"
torch_after=$("$PY" -c "import torch; print(torch.__version__)")
if [ "$torch_after" != "$torch_before" ]; then
    echo "vllm_v1.sh: torch changed from $torch_before to $torch_after" >&2
    exit 1
fi
if ! imports_ok; then
    echo "vllm_v1.sh: vLLM 0.25.1's modules still do not import:" >&2
    PYTHONPATH="$TARGET" "$PY" -c \
        "import vllm.v1.sample.logits_processor, vllm.sampling_params, vllm.config" >&2
    exit 1
fi
