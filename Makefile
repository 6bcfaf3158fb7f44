# accum: `make demo` runs the main job on the embedded default; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The stamp changes whenever the dependency list or the pins change, so `make` reinstalls then only.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt examples/plugin/pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install browser test test-fast compose-test test-reliability reliability-report demo up lint bench clean screenshots

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt examples/plugin/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,models,trackers,finetune]'
	$(PY) -m pip install --quiet --no-deps --no-build-isolation ./examples/plugin
	@rm -f $(VENV)/.installed-*
	@touch $@

# Debian's Chromium for the dashboard's browser tests (Playwright drives it; no browser download).
browser:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "browser tests need Debian's chromium: sudo apt-get install chromium" >&2; fi; }

# The whole suite on two processes that steal work from each other, one intra-op thread each
# (their workers and ranks too), as test-fast; every test is safe for it (free ports, own
# databases, Redis databases and homes). It writes each test's seconds, CPU seconds and lane
# to build/test-durations.json: `python tools/durations_report.py` keeps that record in
# bench/results/ and rewrites its section of docs/development.md.
TEST_WORKERS ?= 2
test: install browser
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal \
	  --durations-record build/test-durations.json $(PYTEST_ARGS)

# The inner loop: every test whose markers leave it in (tests/slow_rule.py): not `slow` (a test
# that took more than about 10 s: tests/reliability's faults, load and fuzzing, tests/bench's
# smoke runs, jobs through real workers and ranks), not `browser`, not the extra cases of sweeps
# (`sweep`: every torchvision model where one per family is stepped, the PostgreSQL and
# PostgreSQL + Redis cases of the backend sweeps: tests/conftest.py FAST_LANE_CASES), on two
# processes that steal work from each other (the long tests do not all end on one). One
# intra-op thread per process, their workers included: two processes with two threads each on
# two cores mostly spin (tests/accumcore measured 60 CPU-s against 119). `make test` runs all.
test-fast: install
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist worksteal \
	  -m "not slow and not browser and not reliability_slow and not sweep and not compose" $(PYTEST_ARGS)

# The deployment, end to end (docs/deployment.md): Docker engine (installed when absent),
# both images built from the wheel, the compose stack up on this machine through
# docker/compose.test.yml, a job through it (a worker restart mid-job included), torn down.
compose-test: install
	PYTHON=$(abspath $(PY)) bash docker/compose_test.sh

# Every reliability test, the slow ones too, plus bench/service/load.py; figures land in
# bench/results/ and docs/reliability.md is rewritten from them.
test-reliability: install browser
	ACCUM_RECORD_RELIABILITY=1 $(PY) -m pytest tests/reliability -m "" $(PYTEST_ARGS)
	$(PY) -m bench.service.load --out bench/results
	$(PY) tools/reliability_report.py

# Rewrite docs/reliability.md from the recorded figures without running anything.
reliability-report: install
	$(PY) tools/reliability_report.py

demo: install
	$(VENV)/bin/accum demo

up: install
	$(VENV)/bin/accum up

lint: install
	$(VENV)/bin/ruff check src services tests bench tools
	$(VENV)/bin/mypy

bench: install
	$(PY) -m bench.run_all

# PNGs of the dashboard's main pages at 1366x900 and 360x800, for the README and docs/dashboard.md (about 2 min).
screenshots: install browser
	$(PY) tests/dashboard/screenshots.py docs/screenshots

clean:
	rm -rf $(VENV) .accum .pytest_cache
