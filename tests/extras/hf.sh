#!/usr/bin/env bash
# transformers for tests/test_hf.py (logitsproc_rs.hf against model.generate). Idempotent.
# Installed under a constraint pinning the venv's own torch (never a second torch), and the
# torch the venv had is checked afterwards. Every pip call holds the shared lock: other
# scripts install into the same venv concurrently.
set -euo pipefail
: "${VENV:=$HOME/.cache/logitsproc_rs/venv}"
: "${PY:=$VENV/bin/python}"
CACHE="$HOME/.cache/logitsproc_rs"
LOCK="$CACHE/pip.lock"
TRANSFORMERS=5.23.0
TORCH=2.15.0
mkdir -p "$CACHE"

version() {  # the installed version of a distribution, empty when absent
    "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}

if [ "$(version transformers)" = "$TRANSFORMERS" ]; then
    exit 0
fi
torch_before=$(version torch)
case "$torch_before" in
    "$TORCH" | "$TORCH"+*) ;;
    *) echo "hf.sh: the venv has torch '$torch_before', expected $TORCH" >&2; exit 1 ;;
esac
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$TORCH" >"$constraints"
flock "$LOCK" "$PY" -m pip install -q -c "$constraints" "transformers==$TRANSFORMERS"
if [ "$(version torch)" != "$torch_before" ]; then
    echo "hf.sh: pip changed torch ($torch_before -> $(version torch))" >&2
    exit 1
fi
