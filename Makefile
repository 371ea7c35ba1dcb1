# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Heavy builds are cached outside the repo, under ~/.cache/gguf-exact/ and keyed by llama.cpp
# commit, backend and CPU features: the llama-cpp-python bindings as a wheel (wheels/, about
# 8 minutes on 2 cores) and llama-server (llama.cpp/, about 5 minutes). A clean clone on the
# same machine reuses both; another machine (other CPU features) builds its own.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# The backend of the bindings and of llama-server: CPU, or make setup CUDA=86|75 / VULKAN=1.
CUDA    ?=
VULKAN  ?=
BACKEND := $(if $(CUDA),cuda$(CUDA),$(if $(VULKAN),vulkan,cpu))
BACKEND_FLAGS := $(strip $(if $(CUDA),--cuda $(CUDA)) $(if $(VULKAN),--vulkan))
# A Vulkan build first installs the Debian packages it needs (glslc, spirv-headers, libvulkan-dev,
# lavapipe, vulkaninfo), as apt-get would; nothing when they are there.
VULKAN_DEPS := $(if $(VULKAN),scripts/install-vulkan-deps.sh && )

.PHONY: setup test test-quick test-vulkan demo bench clean parity

# Everything but the bindings; pip never builds llama-cpp-python itself (its native build
# traps on AMX CPUs at the pinned commit): the next step builds and installs it.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[server,test]'
	touch $@

# The bindings for $(BACKEND), built like llama-server, probed, then installed (one stamp per backend).
# The carried llama.cpp patches are part of the build: a changed patch set remakes the stamp, so an
# old venv never keeps bindings built without them.
SOURCE_PATCHES := gguf_exact/builds/source_patches.py $(wildcard gguf_exact/builds/patches/*.patch)
$(VENV)/.bindings-$(BACKEND): $(VENV)/.installed $(SOURCE_PATCHES)
	$(VULKAN_DEPS)$(BIN)/python -m gguf_exact.builds.bindings_build --install $(BACKEND_FLAGS)
	$(BIN)/pip install -q -e '.[llama,server,test]'
	rm -f $(VENV)/.bindings-*
	touch $@

# The packer's kernels compiled ahead of time (numba.pycc, seconds; cached per machine under
# ~/.cache/gguf-exact/kernels/): convert and verify then start without loading numba. Remade when
# the kernels' source changes; a build that fails leaves numba's JIT kernels in use, as before.
# After the bindings, whose install could move numpy (part of the kernels' key).
KERNEL_SOURCES := $(wildcard gguf_exact/core/*.py) gguf_exact/builds/aot_kernels.py gguf_exact/builds/aot_kernels_build.py
$(VENV)/.kernels: $(VENV)/.installed $(KERNEL_SOURCES)
	$(BIN)/python -m gguf_exact.builds.aot_kernels_build || echo "note: no compiled kernels; convert and verify use numba's JIT"
	touch $@

setup: $(VENV)/.installed $(VENV)/.bindings-$(BACKEND) $(VENV)/.kernels

test: setup llama-server
	$(BIN)/python -m pytest -q -m "not vulkan"

# The GPU path where there is no GPU: the Vulkan llama-server and the Python engine on Vulkan
# bindings, on Mesa's lavapipe (a Vulkan device on the CPU), through the real profiles, beside the
# CPU builds (tests marked vulkan). Installs the Debian packages, builds the Vulkan llama-server and
# the Vulkan bindings wheel once (2669 s and 2057 s measured on 2 busy cores; cached), then the tests (about
# 20 min). The wheel is not installed: the venv keeps its CPU bindings, and the tests unpack the
# cached wheel into a folder that only the Vulkan engine's processes put first on PYTHONPATH.
# Not in `make test`: see README, "Tests". Run it after any change to the serving path.
test-vulkan: setup llama-server
	scripts/install-vulkan-deps.sh
	scripts/build-llama-cpp.sh --vulkan
	$(BIN)/python -m gguf_exact.builds.bindings_build --vulkan
	$(BIN)/python -m pytest -q -m vulkan

# mypy over gguf_exact/ (settings in pyproject.toml), then the tests that need neither build
# (pytest -m: no llama_server, no bindings mark): a venv from PyPI only, nothing built, about 10
# minutes on 2 cores. CI runs it first in the fresh clone with an empty HOME (.ci/run), then `make test`.
test-quick: $(VENV)/.installed
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m "not llama_server and not bindings and not vulkan"

demo: setup
	$(BIN)/gguf-exact demo build/demo

# convert against llama-quantize (full E2B drafter, 262,144-token vocabulary without merges and
# with 500,000), every command's GGUF checks on that vocabulary, then quality at the full E2B shape
# (a peaked synthetic QAT model, its exact re-pack and its Google-style donor against the bf16
# reference: about 30 GB in a temp folder, deleted after; 45 minutes or more on 2 shared cores):
# the tables in docs/benchmarks.md and docs/quality.md; then the drafter table at the full E2B
# shape (one bf16 checkpoint as exact Q4_0, llama.cpp's Q8_0 and bf16, each drafting for the same
# target: acceptance alike; the pair kept in build/bench-drafters and reused).
BENCH_QUALITY_ARGS ?= --chunks 4 --ctx 256
BENCH_DRAFTERS_ARGS ?= --shape e2b --kind real
bench: setup llama-server
	$(BIN)/python scripts/bench_convert.py
	$(BIN)/python scripts/bench_checks.py
	$(BIN)/python scripts/bench_quality.py $(BENCH_QUALITY_ARGS)
	$(BIN)/python scripts/bench_drafters.py $(BENCH_DRAFTERS_ARGS) --json build/bench-drafters.json

# In-process draft-mtp runner against llama-server on tiny models (tokens/s ratio, Python
# overhead per step); without a built llama-server it prints the runner's figures only.
.PHONY: bench-runner
bench-runner: setup
	$(BIN)/python scripts/bench_runner.py

# The Python engine (serve --engine python) beside llama-server, both over HTTP, on tiny models:
# tokens/s and their ratio, tokens per target pass, acceptance, Python time per pass.
.PHONY: bench-engines
bench-engines: setup llama-server
	$(BIN)/python scripts/bench_engines.py

clean:
	rm -rf build $(VENV)

# Parity with llama.cpp's own converter (not in CI): the structural tiny drafters and targets of
# every Gemma 4 size converted by gguf-exact and by the pinned sdist's convert_hf_to_gguf.py,
# every key, tensor name and shape and rope_freqs compared (scripts/parity.py; table in docs/sizes-and-parity.md);
# then the drafter's ordered-embedding head in llama.cpp against transformers' own (tests/test_head_parity.py).
# Its own venv holds torch and transformers (the `parity` extra) and upstream's gguf-py.
PARITY_VENV ?= build/parity-venv
$(PARITY_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PARITY_VENV)
	$(PARITY_VENV)/bin/pip install -q --upgrade pip
	$(PARITY_VENV)/bin/pip install -q -e '.[parity]'
	touch $@

parity: setup $(PARITY_VENV)/.installed
	$(BIN)/python scripts/parity.py --python $(PARITY_VENV)/bin/python --work build/parity
	$(BIN)/python -m pytest -q tests/test_head_parity.py

# llama-server (+ llama-bench, llama-perplexity, llama-quantize) from the pinned sdist's
# vendor/llama.cpp, cached in ~/.cache/gguf-exact/llama.cpp/<commit>-<backend>-<CPU features>:
# 5-9 min once on 2 cores for the CPU build, instant afterwards. GPU builds (not part of
# `make test`; see docs/building-llama-cpp.md for their times): make llama-server CUDA=86 (or 75), VULKAN=1
.PHONY: llama-server serve
llama-server: setup
	$(VULKAN_DEPS)scripts/build-llama-cpp.sh $(BACKEND_FLAGS)

# The carried patches (gguf_exact/builds/patches/) applied to another llama.cpp git checkout on a
# new branch, one commit each, naming each that conflicts: make rebase-patches LLAMA_CPP=~/src/llama.cpp
# (the procedure, and --export to write the branch back: docs/building-llama-cpp.md)
.PHONY: rebase-patches
rebase-patches: $(VENV)/.installed
	$(BIN)/python scripts/rebase_patches.py $(LLAMA_CPP)

# make serve MODEL=target.gguf [DRAFT=drafter.gguf] [PROFILE=auto|rtx3050|...] [PORT=8080] [ARGS=--detach]
# (without DRAFT serve finds the drafter; ARGS=--fetch-draft fetches it)
PROFILE ?= auto
PORT    ?= 8080
serve: setup
	$(BIN)/gguf-exact serve --profile $(PROFILE) --model $(MODEL) $(if $(DRAFT),--draft $(DRAFT)) --port $(PORT) $(ARGS)

# The drafters: each recipe's checkpoint and published exact file, checked against
# checksums/<recipe>.sha256 before they are placed in $(MODELS)/<repo>/<file> (downloads go
# through the Hub cache and resume), the checkpoint converted with its ordered-embedding head to
# $(MODELS)/converted/ (the published file alone where the checkpoint is not pinned: E4B's).
# build-draft rebuilds them from Google's sources at the pinned commits and fails unless the
# rebuild is the published file (same sha256) or holds the same levels with other scales.
.PHONY: draft build-draft
MODELS  ?= models
DRAFTS  ?= e2b-assistant e4b-assistant
draft: setup
	@for r in $(DRAFTS); do $(BIN)/gguf-exact fetch $$r --models-dir $(MODELS) || exit 1; done
build-draft: setup
	@for r in $(DRAFTS); do $(BIN)/gguf-exact build $$r --models-dir $(MODELS) --out-dir build/drafters || exit 1; done

# repack of a synthetic E2B-shaped model (SCALE=1.0 is full size: 9.3 GB source, 3.2 GB donor)
# beside the published method, values/s and peak RSS; files in a temp folder, deleted after.
.PHONY: bench-repack
SCALE ?= 0.02
bench-repack: setup
	$(BIN)/python scripts/bench_repack.py --scale $(SCALE)

# Speculation at the real models' size (scripts/bench_real.py): full-size E2B and E4B pairs made
# on the spot (gguf-exact make-pair, 3.4 + 5.2 GB under build/real-pairs, deleted after), the target
# alone, n-max 1..4 and the adaptive length up to 4 (drafters hidden, mixed, real) in llama-server
# and the Python engine over HTTP, every arm of a kind loaded at once (--interleave kind; none: one
# arm at a time), --parallel 2 and 4; prints
# the tables, writes build/bench-real/bench-real.{json,md}. Hours on 2 CPU cores; a short run:
#   make bench-real BENCH_REAL_ARGS="--shapes e2b --n-max 1,3 --n-predict 16 --prompts 1 --parallel 2"
# Gemma's sampling beside greedy, sampled arms once per verification rule: --samplers greedy,gemma
# --rules exact,rejection (docs/benchmarks.md).
.PHONY: bench-real memory-real
BENCH_REAL_ARGS ?=
bench-real: setup llama-server
	$(BIN)/python scripts/bench_real.py $(BENCH_REAL_ARGS)

# Many users at once (scripts/bench_load.py): llama-server with --parallel 1, 2, 4 and as many
# concurrent clients, speculation off, n-max 1 and 3 and the cpu profile's adaptive length, greedy
# and Gemma's sampling: total tokens/s, latency median/p90, acceptance per slot, and where the
# drafter stops paying. The tiny pairs by default (a minute); full size, e.g.:
#   make bench-load BENCH_LOAD_ARGS="--pair mixed=T.gguf,D.gguf --n-predict 24 --out build/bench-load-e2b"
# The soak (no request lost or changed under 4 clients): scripts/soak_load.py --duration 600
.PHONY: bench-load
BENCH_LOAD_ARGS ?=
bench-load: setup llama-server
	$(BIN)/python scripts/bench_load.py $(BENCH_LOAD_ARGS)

# Speculative sampling's acceptance per depth (scripts/bench_acceptance.py): each engine at a fixed
# length with spec-rejection-sampling, Gemma's sampler, its trace's drafts kept against the chances
# the rule gave them (a z-score per depth) and the pair's make-pair figure. The tiny sampled pair
# by default (seconds); full size, e.g.:
#   make bench-acceptance BENCH_ACCEPTANCE_ARGS="--target T.gguf --drafter D.gguf --n-predict 512 --sum-min 0.833,0.804,0.801"
.PHONY: bench-acceptance
BENCH_ACCEPTANCE_ARGS ?=
bench-acceptance: setup llama-server
	$(BIN)/python scripts/bench_acceptance.py $(BENCH_ACCEPTANCE_ARGS)

# Serving over llama.cpp's RPC backend (scripts/bench_rpc.py): tokens/s with and without the
# drafter on one machine and over two loopback rpc-server workers, and the bytes one request
# moves per target pass and per draft step; the full-size pair kept in build/rpc-bench.
.PHONY: bench-rpc
BENCH_RPC_ARGS ?= --shape e2b
bench-rpc: setup llama-server
	$(BIN)/python scripts/bench_rpc.py $(BENCH_RPC_ARGS) --out build/bench-rpc.json

# The memory plan against llama-server's logged buffers for the full-size pairs at the cpu,
# rtx3050 and gtx1650ti profiles' settings (scripts/memory_real.py); pairs kept in build/real-pairs.
memory-real: setup llama-server
	@for s in e2b e4b; do test -f build/real-pairs/$$s/drafter.gguf || \
		$(BIN)/gguf-exact make-pair build/real-pairs/$$s --shape $$s --kind hidden || exit 1; done
	$(BIN)/python scripts/memory_real.py build/real-pairs/e2b build/real-pairs/e4b --out build/memory-real.json
