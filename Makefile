# The two commands of the README:
#   make demo   set up .venv and run the demo
#   make test   set up .venv and run the test suite
# Both create or refresh .venv when pyproject.toml changed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow lint format bench clean

# deploy/install.sh is also the Dockerfile's install recipe: running it here keeps the image's
# steps tested. torch==2.13.0 first (the CPU build on this machine's disk), then the project.
$(STAMP): pyproject.toml deploy/install.sh
	PYTHON=$(PYTHON) CBO_EXTRAS=test CBO_EDITABLE=1 bash deploy/install.sh $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cbo-agent demo $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -m "not slow" $(ARGS)

test-slow: $(STAMP)
	$(BIN)/pytest -m slow $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/cbo-agent bench gp-update --json results/gp_update.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
