# The single entry point: `make demo` runs the portal on embedded defaults, `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: install demo test lint messages clean

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

# Translations: gather the marked strings into locale/<lang>/LC_MESSAGES/*.po (portal pages, the live
# pages' JavaScript) and peer_agent/locale/ (the agent's CLI), then compile the .mo files the portal and
# the agent read. Both are committed, so a clean clone runs without GNU gettext; tests/portal/test_translations.py
# fails when a marked string has no Bengali translation or a .mo is older than its .po.
MESSAGES_IGNORE := --ignore=.venv --ignore=tests --ignore=bench --ignore=harness --ignore=peer_agent --ignore=var --ignore=staticfiles --ignore=static/vendor
messages: install
	$(PY) manage.py makemessages --locale=bn --no-obsolete --no-location $(MESSAGES_IGNORE)
	$(PY) manage.py makemessages --locale=bn --no-obsolete --no-location --domain=djangojs $(MESSAGES_IGNORE)
	xgettext --language=Python --from-code=UTF-8 --keyword=_ --keyword=ngettext:1,2 --no-location \
	  --package-name=peer-agent --output=peer_agent/locale/peer_agent.pot peer_agent/*.py
	msgmerge --quiet --update --backup=none --no-location peer_agent/locale/bn/LC_MESSAGES/peer_agent.po peer_agent/locale/peer_agent.pot
	$(PY) manage.py compilemessages --locale=bn --ignore=.venv
	msgfmt --check -o peer_agent/locale/bn/LC_MESSAGES/peer_agent.mo peer_agent/locale/bn/LC_MESSAGES/peer_agent.po

lint: install
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layout.py

clean:
	rm -rf $(VENV) var staticfiles
