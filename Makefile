# Set-up and entry points. `make demo` and `make test` work on a fresh machine with Python 3.11 + pip.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint bench clean

# pip without byte-compiling every file of every package (a third of the set-up's time here)
$(BIN)/arcsim: pyproject.toml requirements-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile -r requirements-ci.txt
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	touch $@

# then the byte-code of what arcsim and its tests import, in one process (tests/write_bytecode.py)
BYTECODE := $(VENV)/.bytecode-written
WRITE_BYTECODE := $(BIN)/python tests/write_bytecode.py && touch $(BYTECODE)
$(BYTECODE): $(BIN)/arcsim
	$(WRITE_BYTECODE)

demo: $(BYTECODE)
	$(BIN)/arcsim run

# mypy starts first, beside the byte-code (one process on one core: mypy takes the other); arcsim's byte-code is
# written before the suite (where PYTHONDONTWRITEBYTECODE is set, each of its ~200 processes would compile what it
# imports again). mypy and the wheel check run beside the suite (its workers often wait on child processes); each
# one's output is printed whole when it ends, and any failure fails the target
test: $(BIN)/arcsim
	@$(BIN)/mypy > $(VENV)-mypy.log 2>&1 & mypy=$$!; \
	{ [ -e $(BYTECODE) ] || { $(WRITE_BYTECODE); }; } && $(BIN)/ruff check . && $(BIN)/python -m compileall -q arcsim \
		|| { kill $$mypy; exit 1; }; \
	$(BIN)/python tests/install_check.py --venv $(VENV)-wheel > $(VENV)-wheel.log 2>&1 & wheel=$$!; \
	$(BIN)/pytest -q -n auto --maxprocesses 4 --dist loadgroup --durations=15; status=$$?; \
	wait $$mypy || status=1; echo "--- mypy"; cat $(VENV)-mypy.log; \
	wait $$wheel || status=1; echo "--- the wheel from another folder (tests/install_check.py)"; cat $(VENV)-wheel.log; \
	exit $$status

bench: $(BIN)/arcsim
	$(BIN)/python benchmarks/des_scaling.py

clean:
	rm -rf $(VENV) $(VENV)-wheel $(VENV)-mypy.log $(VENV)-wheel.log build dist *.egg-info
