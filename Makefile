# The single entry point: `make demo` runs the portal on embedded defaults, `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: install demo test lint clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

demo: install
	$(PY) manage.py demo

test: install
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) var staticfiles
