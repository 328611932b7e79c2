# Set-up and entry points. `make demo` and `make test` work on a fresh machine with Python 3.11 + pip.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint bench clean

# pip without byte-compiling every file of every package (a third of the set-up's time here), then the byte-code of
# what arcsim and its tests import, in one process (tests/write_bytecode.py)
$(BIN)/arcsim: pyproject.toml requirements-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile -r requirements-ci.txt
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	$(BIN)/python tests/write_bytecode.py
	touch $@

demo: $(BIN)/arcsim
	$(BIN)/arcsim run

# arcsim's byte-code is written first (where PYTHONDONTWRITEBYTECODE is set, each of the suite's ~200 processes
# would compile what it imports again). mypy and the wheel check run beside the suite (its workers often wait on
# child processes); each one's output is printed whole when it ends, and any failure fails the target
test: $(BIN)/arcsim
	$(BIN)/ruff check .
	@$(BIN)/python -m compileall -q arcsim
	@$(BIN)/mypy > $(VENV)-mypy.log 2>&1 & mypy=$$!; \
	$(BIN)/python tests/install_check.py --venv $(VENV)-wheel > $(VENV)-wheel.log 2>&1 & wheel=$$!; \
	$(BIN)/pytest -q -n auto --maxprocesses 4 --dist loadgroup --durations=15; status=$$?; \
	wait $$mypy || status=1; echo "--- mypy"; cat $(VENV)-mypy.log; \
	wait $$wheel || status=1; echo "--- the wheel from another folder (tests/install_check.py)"; cat $(VENV)-wheel.log; \
	exit $$status

bench: $(BIN)/arcsim
	$(BIN)/python benchmarks/des_scaling.py

clean:
	rm -rf $(VENV) $(VENV)-wheel $(VENV)-mypy.log $(VENV)-wheel.log build dist *.egg-info
