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

test: setup
	$(BIN)/python -m pytest -q

demo: setup
	$(BIN)/gguf-exact demo build/demo

bench: setup
	$(BIN)/python scripts/bench_convert.py

clean:
	rm -rf build $(VENV)
