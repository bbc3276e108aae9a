# make install: .venv with the pinned dependencies, the .[hf] extra included (idempotent)
# make test:    the whole test suite (what CI runs)
# make demo:    train the tiny model on the offline default data, then analyse it
# make bench:   training and analysis throughput against PyTorch / transformers (docs/benchmarks.md)
# make install ACCEL=cuda12 | cuda13 | tpu: the same, plus jax's accelerator plugin (requirements-ACCEL.lock);
#               later targets keep the accelerator installed last
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ACCELS := cpu cuda12 cuda13 tpu
ACCEL ?= $(shell cat $(VENV)/.accel 2>/dev/null || echo cpu)
ACCEL_LOCK := $(if $(filter-out cpu,$(ACCEL)),requirements-$(ACCEL).lock)
STAMP := $(VENV)/.installed-$(ACCEL)
JAX_VERSION := $(shell sed -n 's/^jax==//p' requirements.lock)
DEMO_DIR ?= runs/demo

.PHONY: install check-accel test test-fast demo bench lock lock-accel clean

install: check-accel $(STAMP)

check-accel:
	@case " $(ACCELS) " in *" $(ACCEL) "*) ;; *) echo "ACCEL=$(ACCEL): must be one of $(ACCELS)" >&2; exit 2;; esac

$(STAMP): requirements.lock $(ACCEL_LOCK) pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock $(if $(ACCEL_LOCK),-r $(ACCEL_LOCK))
	$(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed $(VENV)/.installed-*
	echo $(ACCEL) > $(VENV)/.accel
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

# Re-resolve requirements-{cuda12,cuda13,tpu}.lock: jax's plugin for each, on top of requirements.lock
# (resolved from the package index's metadata; nothing is installed).
lock-accel:
	for a in cuda12 cuda13 tpu; do \
	  $(PY) -m pip install --dry-run --quiet --report /tmp/abspos_$$a.json -r requirements.lock "jax[$$a]==$(JAX_VERSION)" && \
	  $(PY) -c "import json, sys; r = json.load(open('/tmp/abspos_$$a.json')); \
	    print('# jax[$$a] on top of requirements.lock: make install ACCEL=$$a (make lock-accel re-resolves it)'); \
	    print('\n'.join(sorted(i['metadata']['name'] + '==' + i['metadata']['version'] for i in r['install'])))" \
	    > requirements-$$a.lock || exit 1; \
	done

clean:
	rm -rf $(VENV) runs
