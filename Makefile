# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Heavy builds are cached outside the repo: pip's wheel cache keeps the
# llama-cpp-python build (about 8 minutes on 2 cores) for every clone on this machine.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[llama,test]'
	touch $@

setup: $(VENV)/.installed

test: setup llama-server
	GGUF_EXACT_REQUIRE_SERVER=1 $(BIN)/python -m pytest -q

demo: setup
	$(BIN)/gguf-exact demo build/demo

bench: setup
	$(BIN)/python scripts/bench_convert.py

# In-process draft-mtp runner against llama-server on tiny models (tokens/s ratio, Python
# overhead per step); without a built llama-server it prints the runner's figures only.
.PHONY: bench-runner
bench-runner: setup
	$(BIN)/python scripts/bench_runner.py

clean:
	rm -rf build $(VENV)

# llama-server (+ llama-bench, llama-perplexity, llama-quantize) from the pinned sdist's
# vendor/llama.cpp, cached in ~/.cache/gguf-exact/llama.cpp/<commit>-<backend>: 5-9 min
# once on 2 cores for the CPU build, instant afterwards. GPU builds (not part of `make test`;
# see README "Build" for their times): make llama-server CUDA=86 (or 75), VULKAN=1
.PHONY: llama-server serve
CUDA   ?=
VULKAN ?=
llama-server: setup
	scripts/build-llama-cpp.sh $(strip $(if $(CUDA),--cuda $(CUDA)) $(if $(VULKAN),--vulkan))

# make serve PROFILE=rtx3050 MODEL=target.gguf DRAFT=drafter.gguf [PORT=8080] [ARGS='--detach']
PROFILE ?= cpu
PORT    ?= 8080
serve: setup
	$(BIN)/gguf-exact serve --profile $(PROFILE) --model $(MODEL) $(if $(DRAFT),--draft $(DRAFT)) --port $(PORT) $(ARGS)

# The published exact drafters, each checked against checksums/<recipe>.sha256 before it is
# placed in $(MODELS)/<repo>/<file> (downloads go through the Hub cache and resume).
# build-draft rebuilds them from Google's sources at the pinned commits and fails unless the
# rebuild is the published file (same sha256) or holds the same levels with other scales.
.PHONY: draft build-draft
MODELS  ?= models
DRAFTS  ?= e2b-assistant e4b-assistant
draft: setup
	@for r in $(DRAFTS); do $(BIN)/gguf-exact fetch $$r --what exact --models-dir $(MODELS) || exit 1; done
build-draft: setup
	@for r in $(DRAFTS); do $(BIN)/gguf-exact build $$r --models-dir $(MODELS) --out-dir build/drafters || exit 1; done

# repack of a synthetic E2B-shaped model (SCALE=1.0 is full size: 9.3 GB source, 3.2 GB donor)
# beside the published method, values/s and peak RSS; files in a temp folder, deleted after.
.PHONY: bench-repack
SCALE ?= 0.02
bench-repack: setup
	$(BIN)/python scripts/bench_repack.py --scale $(SCALE)
