#!/usr/bin/env bash
# transformers for tests/test_hf.py (logitsproc_rs.hf against model.generate) and vLLM's config
# module. Idempotent; installed under a constraint pinning the venv's own torch.
set -euo pipefail
source "$(dirname "$0")/_pip.sh"
TRANSFORMERS=5.23.0
[ "$(version transformers)" = "$TRANSFORMERS" ] && exit 0
pip_keep_torch "transformers==$TRANSFORMERS"
