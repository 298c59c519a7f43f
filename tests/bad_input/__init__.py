"""Bad input, one file per surface: batch updates, per-request params, logits, configs and
capacities, misused calls, and the crash cases run in subprocesses of their own."""
