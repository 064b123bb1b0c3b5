# Two commands do everything on a fresh machine:
#   make demo   - build (once) the embedded default models and show the speed-up of each strategy
#   make test   - run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specdec-installed

.PHONY: demo test test-slow bench venv clean docs

$(STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh $(VENV)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m specdec.family.demo $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

bench: $(STAMP)
	$(PY) -m specdec.cli bench $(ARGS)

DOCS_STAMP := $(VENV)/.specdec-docs-installed

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q "mkdocs>=1.6" "mkdocs-material>=9.5" "mkdocstrings[python]>=0.26"
	touch $@

docs: $(DOCS_STAMP)      # the docs site into site/ (strict: a broken link or reference fails)
	$(PY) -m specdec.config_reference > docs/configuration.md
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info
