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

target_install() {  # target_install SPEC DIR MARKER: pip install --no-deps SPEC into DIR once
    local spec=$1 dir=$2 marker=$3
    [ -f "$dir/$marker" ] && return 0
    rm -rf "$dir.partial"
    flock "$LOCK" "$PY" -m pip install -q --no-deps --no-compile --target "$dir.partial" "$spec"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"  # only a complete install counts as installed
}
