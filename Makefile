# The two set-up commands of the README, plus developer conveniences.
#   make run    install (idempotent) and run the main job on the embedded default
#   make test   install (idempotent), lint and type-check (make lint), then run the whole test suite (what CI runs)
#   make lint   ruff check, ruff format --check and mypy (configured in pyproject.toml)
# The cache is raypipe's own, as for every entry point: $RAYPIPE_CACHE if set, else ~/.cache/raypipe.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.raypipe-installed
# The MLflow UI (full mlflow caps pyarrow below the stack's): its own environment, for the UI test.
MLFLOW_UI_VENV ?= .venv-mlflow-ui
MLFLOW_UI := $(MLFLOW_UI_VENV)/bin/mlflow
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
PYTEST_ARGS ?=
LINT_PATHS := raypipe tests benchmarks scripts jobs

.PHONY: install run test test-fast lint
install: $(STAMP)

# The installer and the job print their own first lines, so make does not echo these commands.
$(STAMP): pyproject.toml scripts/install.sh scripts/install_check.py
	@bash scripts/install.sh $(VENV) cpu
	@touch $(STAMP)

run: $(STAMP)
	@$(PY) jobs/probe.py

$(MLFLOW_UI):
	python3 -m venv $(MLFLOW_UI_VENV)
	$(MLFLOW_UI_VENV)/bin/python -m pip install -q --disable-pip-version-check "mlflow==3.17.2"

lint: $(STAMP)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)
	$(PY) -m mypy

test: $(STAMP) lint $(MLFLOW_UI)
	RAYPIPE_MLFLOW_UI=$(abspath $(MLFLOW_UI)) $(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)
