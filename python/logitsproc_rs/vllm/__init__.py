"""Bridges into vLLM itself.

- ``logitsproc_rs.vllm.v1``: our processors as subclasses of vLLM 0.25.1's ``LogitsProcessor``
  (``--logits-processors logitsproc_rs.vllm.v1:<Class>``), consuming vLLM's own ``BatchUpdate``.
- ``logitsproc_rs.vllm.v2``: the same processors for vLLM's Model Runner V2 (vLLM >= 0.32), on
  the pipeline's stable-slot front-end.

Importing either submodule imports vLLM; importing this package does not.
"""

from ._fields import NAMESPACE, to_wire

__all__ = ["NAMESPACE", "to_wire"]
