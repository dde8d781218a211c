# Two commands do all the set-up: `make run` (the main job) and `make test` (the test suite).
# Both create .venv and install the project on first use. `make run-offline` runs the main
# job on a synthetic archive in the CIFAR-10 format (no download). ARGS="--epochs 2" passes
# options to train-cifar.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run run-offline test test-fast test-containers check clean slurm gpu-benchmark

run: $(STAMP)
	$(VENV)/bin/train-cifar $(ARGS)

run-offline: $(STAMP)
	$(VENV)/bin/train-cifar --synthetic $(ARGS)

test: $(STAMP) slurm
	$(VENV)/bin/python -m pytest

# The tests that start no server, cluster or rank process (see tests/conftest.py): seconds to
# a couple of minutes, for the edit-test loop. `make test` stays the whole suite.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -m "not integration"

# The compose stack for real (podman, podman-compose, debootstrap: Debian's packages): builds the
# images (cached after the first time), brings docker/docker-compose.yml up with
# docker/compose.test.yml, runs a deployment in it, checks the registry and the volumes, and
# removes every container, network and volume it made (tests/containers/).
test-containers: $(STAMP)
	$(VENV)/bin/python -m pytest tests/containers -v

# The SLURM tests start a real SLURM cluster (tests/slurm_rig.py): Debian's slurm-wlm and munge.
# Where it cannot be installed (not root, no apt-get), the SLURM tests are skipped and say why
# (in CI, CI=true, they fail instead).
slurm:
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq slurm-wlm munge; \
		else \
			echo "SLURM is not installed and cannot be here (needs root and apt-get:" \
				"apt-get install slurm-wlm munge); the SLURM tests will be skipped" \
				"(in CI, CI=true, they fail)."; \
		fi

# On a GPU machine: the pipeline's training against a plain script on one GPU (bf16,
# channels_last), compile off and on, both models; figures go to docs/benchmarks.md.
gpu-benchmark: $(STAMP)
	for model in small_cnn resnet18; do for compile in "" --compile; do \
		$(VENV)/bin/python benchmarks/epoch_throughput.py --gpu --model $$model $$compile \
			--images 45000 --epochs 4 --rounds 3 || exit 1; done; done

check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy trainlib cifar tasks flows cli
	$(VENV)/bin/lint-imports

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	# torch first, pinned: the preinstalled 2.13.0+cpu wheel cannot load torchvision
	$(VENV)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/python -m pip install --quiet -e ".[dev]"
	# Prefect's database template (cli/database_template.py): a new PREFECT_HOME starts fast
	$(VENV)/bin/python -m cli.local_server
	touch $(STAMP)

clean:
	rm -rf $(VENV) trainlib_results cifar-data mlflow.db mlruns
