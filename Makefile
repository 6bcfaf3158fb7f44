# accum: `make demo` runs the main job on the embedded default; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The stamp changes whenever the dependency list or the pins change, so `make` reinstalls then only.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: install test demo up lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

demo: install
	$(VENV)/bin/accum demo

up: install
	$(VENV)/bin/accum up

lint: install
	$(VENV)/bin/ruff check src services tests bench
	$(VENV)/bin/mypy

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .accum .pytest_cache
