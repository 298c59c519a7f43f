#!/usr/bin/env bash
# xgrammar for tests/test_bitmask_backends.py: our grammar bitmask against xgrammar's own
# apply_token_bitmask_inplace (what vLLM's runner calls). Idempotent; never a second torch.
set -euo pipefail
source "$(dirname "$0")/_pip.sh"
XGRAMMAR=0.2.9
[ "$(version xgrammar)" = "$XGRAMMAR" ] && exit 0
pip_keep_torch "xgrammar==$XGRAMMAR"
