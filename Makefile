# Two commands do everything on a fresh machine:
#   make demo   - build (once) the embedded default models and show the speed-up of each strategy
#   make test   - run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specdec-installed

.PHONY: demo test test-slow bench venv clean

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

clean:
	rm -rf $(VENV) build *.egg-info
