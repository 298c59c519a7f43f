"""A column processor bridged at module level, for the real engine's FQCN form:
``LLM(logits_processors=["engine_columns:LogitMargin"])`` (``tests/vllm_engine`` on the path)."""

from __future__ import annotations

from logit_margin import LogitMarginLogitsProcessor

from logitsproc_rs.vllm.v1 import bridge

LogitMargin = bridge(LogitMarginLogitsProcessor, name="LogitMargin", module=__name__)
