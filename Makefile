# Two commands do all the set-up: `make run` (the main job) and `make test` (the test suite).
# Both create .venv and install the project on first use. `make run-offline` runs the main
# job on a synthetic archive in the CIFAR-10 format (no download). ARGS="--epochs 2" passes
# options to train-cifar.
PYTHON ?= python3
# Where torch comes from: PyPI's build by default (CUDA 13: GPUs of compute capability 7.5 and
# newer). A V100 or P100 needs the CUDA 12.6 build, on a fresh .venv:
# make TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 test (docs/scaling.md).
TORCH_INDEX_URL ?=
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run run-offline test test-fast test-containers check clean slurm postgres gpu-benchmark \
	model-env \
	gpu-check soak \
	podman stack-up stack-down stack-rotate stack-up-local stack-down-local stack-rotate-local

run: $(STAMP)
	$(VENV)/bin/train-cifar $(ARGS)

# No package index is needed: the release gate fresh_load loads the version with this
# installation's packages, checked against its declared releases (mlops/model_env.py).
run-offline: $(STAMP)
	CIFAR_FRESH_LOAD_ENV=$${CIFAR_FRESH_LOAD_ENV:-installed} $(VENV)/bin/train-cifar --synthetic $(ARGS)

# Two pytest-xdist workers (TEST_WORKERS=), each taking whole files: most integration tests
# wait on servers, timeouts and heartbeats, so two run side by side on 2 cores. Each worker
# starts its own session services (PostgreSQL, Prefect, SLURM, S3) on free ports.
TEST_WORKERS ?= 2
test: $(STAMP) slurm postgres model-env
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The clean environment the release gate fresh_load loads the pipeline's versions in (their
# declared requirements alone; mlops/model_env.py): built once, about 2.5 minutes and 6 GB,
# kept under CIFAR_MODEL_ENVS (~/.cache/dask-train-cifar/model-envs). An evaluation builds it
# when it is missing; this does it ahead, so no test waits for it.
model-env: $(STAMP)
	$(VENV)/bin/python -m mlops.model_env

# The tests that start no server, cluster or rank process (see tests/conftest.py): seconds to
# a couple of minutes, for the edit-test loop. `make test` stays the whole suite.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -m "not integration"

# The chaos soak: a compressed month of nightlies (by default one per fault and phase, 39 as
# root, in a seeded random order; NIGHTS=, SEED=) on real services, one fault injected a
# night, every check after every night, and a table at the end (docs/reliability.md). About
# 45 minutes on 2 cores; `make test` runs a 6-night one.
SEED ?= 0
soak: $(STAMP) postgres
	$(VENV)/bin/python -m tests.soak $(if $(NIGHTS),--nights $(NIGHTS)) --seed $(SEED)

# The compose stack for real (podman, podman-compose, runc, debootstrap: Debian's packages,
# installed here as root): builds the images (a Debian base once; the dependencies' layer cached
# after the first build), brings docker/docker-compose.yml up with docker/compose.test.yml, runs
# the deployments in it, checks the registry, the volumes and bad input, and removes every
# container, network and volume it made (tests/containers/). `make test` runs these tests only
# where the images were built before (a first build takes about 15 minutes): docs/containers.md.
test-containers: $(STAMP) podman
	CIFAR_CONTAINER_TESTS=build $(VENV)/bin/python -m pytest tests/containers -v

podman:
	@command -v podman >/dev/null && command -v podman-compose >/dev/null && \
		command -v runc >/dev/null && command -v debootstrap >/dev/null || \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq podman podman-compose runc debootstrap; \
		else \
			echo "podman is not installed and cannot be here (needs root and apt-get:" \
				"apt-get install podman podman-compose runc debootstrap)."; exit 1; \
		fi

# The full stack (docs/running.md, "The full stack"): every variable of docker/.env.example set
# (exported, or in docker/.env). stack-up writes the secrets (docker/write_secrets.py, refusing
# a missing one by name), builds the image tagged with this commit, starts every service and
# runs the one-shot deploy (MLflow's training account, the work pool, the deployments; its
# failure fails the target, docker/one_shot.py);
# stack-down stops it and keeps the volumes. COMPOSE="podman compose" or podman-compose work too.
COMPOSE ?= docker compose
STACK := $(COMPOSE) -f docker/docker-compose.yml
GIT_SHA ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
stack-up stack-up-local: export GIT_SHA := $(GIT_SHA)
stack-up:
	python3 docker/write_secrets.py
	$(STACK) up -d --build
	python3 docker/one_shot.py $(STACK) -- deploy

stack-down:
	$(STACK) down

# A credential changed: its new value in docker/.env, then this. Each changed one is altered
# where it lives (PostgreSQL roles, MLflow's admin), its secret rewritten and its services
# restarted (docker/rotate_secrets.py; docs/containers.md, "Rotating a credential").
stack-rotate:
	python3 docker/rotate_secrets.py $(STACK)

# The same on a machine without an image registry, as tests/containers runs it: podman, the
# images built by docker/build-local.sh from a local Debian base in place of the ones the
# shipped file pulls (docker/compose.test.yml).
LOCAL_STACK := podman-compose -p dask-train-cifar -f docker/docker-compose.yml -f docker/compose.test.yml
stack-up-local stack-down-local stack-rotate-local test-containers: export CONTAINERS_CONF ?= $(CURDIR)/docker/podman-containers.conf
stack-up-local: podman
	python3 docker/write_secrets.py
	bash docker/build-local.sh
	$(LOCAL_STACK) up -d
	python3 docker/one_shot.py $(LOCAL_STACK) -- deploy

stack-down-local:
	$(LOCAL_STACK) down

stack-rotate-local:
	python3 docker/rotate_secrets.py $(LOCAL_STACK)

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

# The tests' Prefect server runs on PostgreSQL (tests/postgres_rig.py): Debian's postgresql,
# started by the tests in a temporary folder (as the `postgres` user when root). Where it cannot
# be installed, the tests that need a Prefect server are skipped and say why (in CI they fail).
postgres:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null || \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq postgresql; \
		else \
			echo "PostgreSQL is not installed and cannot be here (needs root and apt-get:" \
				"apt-get install postgresql); the tests that need a Prefect server will be" \
				"skipped (in CI, CI=true, they fail)."; \
		fi

# On a bare GPU host (torch, torchvision and the wheels of benchmarks/gpu_check.txt; no network,
# no venv): the facts, the GPU tests, one round of the comparison below, in about five minutes.
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py --out gpu-check.md

# On a GPU machine: the pipeline's training against a plain script on one GPU (bf16,
# channels_last), compile off and on, both models; figures go to docs/benchmarks.md.
gpu-benchmark: $(STAMP)
	for model in small_cnn resnet18; do for compile in "" --compile; do \
		$(VENV)/bin/python benchmarks/epoch_throughput.py --gpu --model $$model $$compile \
			--images 45000 --epochs 4 --rounds 3 || exit 1; done; done

check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy trainlib cifar mlops tasks flows cli
	$(VENV)/bin/lint-imports

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	# torch first, pinned: the preinstalled 2.13.0+cpu wheel cannot load torchvision
	$(VENV)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1 \
		$(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(VENV)/bin/python -m pip install --quiet -e ".[dev]"
	# Prefect's database template (cli/database_template.py): a new PREFECT_HOME starts fast
	$(VENV)/bin/python -m cli.local_server
	touch $(STAMP)

clean:
	rm -rf $(VENV) trainlib_results cifar-data mlflow.db mlruns
