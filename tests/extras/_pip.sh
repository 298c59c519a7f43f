# Sourced by the extras scripts: the venv's pip, never touching its torch.
# Every pip call holds the shared lock (scripts may install into the same venv concurrently).
: "${VENV:=$HOME/.cache/logitsproc_rs/venv}"
: "${PY:=$VENV/bin/python}"
CACHE="$HOME/.cache/logitsproc_rs"
LOCK="$CACHE/pip.lock"
mkdir -p "$CACHE"

version() {  # the installed version of a distribution, empty when absent
    "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}

pip_keep_torch() {  # pip install ARGS... under a constraint pinning the venv's own torch
    local torch_before constraints
    torch_before=$(version torch)
    if [ -z "$torch_before" ]; then
        echo "extras: the venv has no torch (make venv first)" >&2
        return 1
    fi
    constraints=$(mktemp)
    echo "torch==${torch_before%%+*}" >"$constraints"
    flock "$LOCK" "$PY" -m pip install -q -c "$constraints" "$@"
    rm -f "$constraints"
    if [ "$(version torch)" != "$torch_before" ]; then
        echo "extras: pip changed torch ($torch_before -> $(version torch))" >&2
        return 1
    fi
}
