# make install: .venv with the pinned dependencies, the .[hf] extra included (idempotent)
# make test:    the whole test suite (what CI runs)
# make demo:    train the tiny model on the offline default data, then analyse it
# make bench:   training and analysis throughput against PyTorch / transformers (docs/benchmarks.md)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= runs/demo

.PHONY: install test test-fast demo bench lock clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

test: install
	$(PY) -m pytest -n 2 -q

test-fast: install
	$(PY) -m pytest -n 2 -q -m "not slow"

demo: install
	$(PY) train.py --config=configs/tiny.py --workdir=$(DEMO_DIR)
	$(PY) analyze.py --workdir=$(DEMO_DIR)
	@echo "demo done: metrics in $(DEMO_DIR)/metrics.jsonl, report in $(DEMO_DIR)/analysis/report.md"

bench: install
	$(PY) -m benchmarks.train_throughput
	$(PY) -m benchmarks.analysis_throughput

# Re-resolve the pins from pyproject.toml's ranges (then run `make test`).
lock:
	rm -rf /tmp/abspos_lock && $(PYTHON) -m venv /tmp/abspos_lock
	/tmp/abspos_lock/bin/pip install --quiet ".[test,hf]"
	# --all keeps setuptools (torch needs a newer one than venv ships); torch is pinned without +cpu
	/tmp/abspos_lock/bin/pip freeze --all --exclude pip --exclude abspos_jax | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' > requirements.lock

clean:
	rm -rf $(VENV) runs
