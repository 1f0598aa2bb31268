# The two set-up commands of the README, plus developer conveniences.
#   make run    install (idempotent) and run the main job on the embedded default
#   make test   install (idempotent), lint and type-check (make lint), then run the whole test suite (what CI runs)
#   make lint   ruff check, ruff format --check and mypy (configured in pyproject.toml)
#   make agent  remake the tuned-agent artifact and its dev figures (docs/agent-training.md) in $(AGENT_DIR)
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
AGENT_DIR ?= runs/agent

.PHONY: install run test test-fast lint agent
install: $(STAMP)

# The installer and the job print their own first lines, so make does not echo these commands.
$(STAMP): pyproject.toml scripts/install.sh scripts/install_check.py
	@bash scripts/install.sh $(VENV) cpu
	@touch $(STAMP)

run: $(STAMP)
	@$(PY) jobs/probe.py

agent: $(STAMP)
	$(PY) -m raypipe agent-data $(AGENT_DIR)/data
	$(PY) -m raypipe tune-agent $(AGENT_DIR)/data $(AGENT_DIR)
	$(PY) -m raypipe probe --set engine.adapter=$(AGENT_DIR)/artifact --set data.split=dev --set data.limit=null \
		--out $(AGENT_DIR)/dev
	$(PY) -m raypipe agent-eval $(AGENT_DIR)/dev --artifact $(AGENT_DIR)/artifact

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
