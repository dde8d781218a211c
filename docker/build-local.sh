#!/usr/bin/env bash
# Build the stack's images with podman on a machine that cannot pull from a registry:
#   localhost/debian-py:bookworm      a Debian base with Python 3.11 (debootstrap, once)
#   localhost/dask-train-cifar:latest the project's image (docker/Dockerfile, target app)
#   localhost/dask-train-cifar-s3:latest  the same with SeaweedFS (tests' S3, compose.test.yml)
# With a registry, `docker compose -f docker/docker-compose.yml up -d --build` is all it takes.
# Rebuilds are cached: the dependencies' layer is rebuilt only when pyproject.toml or
# docker/constraints.txt change. A local package mirror (/opt/pypi*, as on the project's
# build machine) is used when present.
set -euo pipefail
cd "$(dirname "$0")/.."
# runc and cgroupfs, as this kind of machine needs (docker/podman-containers.conf)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/docker/podman-containers.conf}
BASE=localhost/debian-py:bookworm
if ! podman image exists "$BASE"; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$root" http://deb.debian.org/debian >/dev/null
    tar -C "$root" -c . | podman import - "$BASE" >/dev/null
fi
flags=(--network=host -f docker/Dockerfile --build-arg "BASE_IMAGE=$BASE")
flags+=(-v /etc/ssl/certs:/etc/ssl/certs:ro)  # the host's CA bundle: pip behind a TLS proxy
if [ -d /opt/pypi-more/simple ]; then
    flags+=(-v /opt/pypi:/opt/pypi:ro -v /opt/pypi-more:/opt/pypi-more:ro
        --build-arg TORCH_INDEX_URL=file:///opt/pypi-more/simple
        --build-arg PIP_INDEX_URL=file:///opt/pypi-more/simple
        --build-arg "PIP_EXTRA_INDEX_URL=file:///opt/pypi/simple https://pypi.org/simple")
fi
build() {  # build target $1 as $2, then drop the image it replaced (7 GB each, else they pile up)
    local before
    before=$(podman image inspect --format '{{.Id}}' "$2" 2>/dev/null || true)
    podman build -q "${flags[@]}" --target "$1" -t "$2" . >/dev/null
    if [ -n "$before" ] && [ "$before" != "$(podman image inspect --format '{{.Id}}' "$2")" ]; then
        podman rmi "$before" >/dev/null 2>&1 || true  # still used by a container: leave it
    fi
}
build app localhost/dask-train-cifar:latest
build seaweedfs localhost/dask-train-cifar-s3:latest
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep dask-train-cifar
