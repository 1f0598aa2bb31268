# The two set-up commands of the README, plus developer conveniences.
#   make run    install (idempotent) and run the main job on the embedded default
#   make test   install (idempotent) and run the whole test suite (what CI runs)
# The cache is raypipe's own, as for every entry point: $RAYPIPE_CACHE if set, else ~/.cache/raypipe.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.raypipe-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
PYTEST_ARGS ?=

.PHONY: install run test test-fast
install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) cpu
	touch $(STAMP)

run: $(STAMP)
	$(PY) jobs/probe.py

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)
