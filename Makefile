# The two commands of the README:
#   make demo   set up .venv and run the demo
#   make test   set up .venv and run the test suite
# Both create or refresh .venv when pyproject.toml changed.
#
#   make image        build the service image (and the Mosquitto image CI runs beside it)
#   make image IMAGE=cbo-agent:cuda MOSQUITTO_IMAGE= \
#     TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128     the CUDA variant (same recipe)
#   make test-image   build them, then run them for real (tests/test_image.py; CI runs it too)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The images: docker where a Docker engine is running, podman (daemonless) elsewhere.
IMAGE           ?= cbo-agent:local
MOSQUITTO_IMAGE ?= cbo-mosquitto:local
ENGINE          ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)

.PHONY: demo test test-slow lint format bench image test-image clean

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
	$(BIN)/pytest -m "not slow and not image" $(ARGS)

test-slow: $(STAMP)
	$(BIN)/pytest -m slow $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Bounded: a cold build (debootstrap'd base included, podman) takes 3-4 minutes here, a cached
# one seconds; the smoke test about two.
image:
	ENGINE=$(ENGINE) IMAGE=$(IMAGE) MOSQUITTO_IMAGE=$(MOSQUITTO_IMAGE) \
	  $(if $(TORCH_INDEX_URL),TORCH_INDEX_URL=$(TORCH_INDEX_URL)) \
	  timeout 900 bash deploy/image/build.sh

test-image: $(STAMP) image
	CBO_TEST_ENGINE=$(ENGINE) CBO_TEST_IMAGE=$(IMAGE) CBO_TEST_MOSQUITTO_IMAGE=$(MOSQUITTO_IMAGE) \
	  timeout 600 $(BIN)/pytest -m image tests/test_image.py $(ARGS)

bench: $(STAMP)
	$(BIN)/cbo-agent bench gp-update --json results/gp_update.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
