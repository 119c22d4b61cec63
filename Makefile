# The lab's two set-up commands are `make run` and `make test`; each builds .venv first if needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed only when no torch is importable: a CUDA build already on a GPU instance is kept.
TORCH_PIN ?= torch==2.13.0
OUT ?= out
ARGS ?=
# `make lab PORT=8899 IP=...`: set on the command line only (`:=`, so a PORT or IP variable in the
# environment of a cloud container never moves or exposes the lab).
PORT := 8888
IP := 127.0.0.1

.PHONY: setup run quick lint test lab bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is needed, found " + sys.version.split()[0])'
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c 'import torch' >/dev/null 2>&1; then \
	    echo "setup: keeping the torch that $(PYTHON) already has (venv sees system packages)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	@$(PY) -c 'import torch' >/dev/null 2>&1 || $(PY) -m pip install "$(TORCH_PIN)"
	$(PY) -m pip install -q -e '.[test]'
	@$(PY) -c 'import torch; print("setup: torch", torch.__version__, "| CUDA available:", torch.cuda.is_available())'
	@touch $@

## Execute every notebook headlessly into $(OUT)/ (executed .ipynb + HTML + index.html).
run: setup
	$(PY) -m labutils run-notebooks --out $(OUT) $(ARGS)

## The same in quick mode (what CI executes).
quick: setup
	$(PY) -m labutils run-notebooks --quick --out $(OUT) $(ARGS)

## ruff over the package, tests, benchmarks and tools (settings in pyproject.toml).
lint: setup
	$(PY) -m ruff check labutils tests benchmarks tools

## The linter, then the whole test suite, in TEST_WORKERS processes (pytest-xdist; each test file in one
## of them, so a file's module-scoped servers start once). Three on two cores: many tests wait on ranks
## and timeouts rather than compute.
TEST_WORKERS ?= 3
test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

## JupyterLab on notebooks/, bound to 127.0.0.1, token kept on (--allow-root added for root);
## prints the URL with its token and the SSH tunnel command for a laptop.
lab: setup
	$(PY) -m labutils lab --ip '$(IP)' --port '$(PORT)'

## Every benchmark script, one after another (run on a quiet machine); fails if any target was missed.
bench: setup
	@failed=""; for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "targets missed in:$$failed"; exit 1; else echo "every benchmark met its targets"; fi

clean:
	rm -rf $(OUT) .pytest_cache
