# Set-up and entry points. `make demo` and `make test` work on a fresh machine with Python 3.11 + pip.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/arcsim: pyproject.toml requirements-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-ci.txt
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(BIN)/arcsim
	$(BIN)/arcsim run

test: $(BIN)/arcsim
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q -n auto --maxprocesses 4 --durations=15
	$(BIN)/python tests/install_check.py --venv $(VENV)-wheel

bench: $(BIN)/arcsim
	$(BIN)/python benchmarks/des_scaling.py

clean:
	rm -rf $(VENV) $(VENV)-wheel build dist *.egg-info
