#!/usr/bin/env bash
# Build the stack's images with podman on a machine that cannot pull from a registry:
#   localhost/debian-py:bookworm      a Debian base with Python 3.11 (debootstrap, once)
#   localhost/dask-train-cifar:latest the project's training image (docker/Dockerfile, target
#                                     app), also tagged with the commit it was built from ($GIT_SHA)
#   localhost/dask-train-cifar-services:latest  the same without torch (target services), for
#                                     what never runs a model; also tagged with the commit
#   localhost/dask-train-cifar-s3:latest  the same with SeaweedFS (tests' S3, compose.test.yml)
#   localhost/dask-train-cifar-postgres:latest  Debian's PostgreSQL (the tests' postgres)
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
GIT_SHA=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
flags=(--network=host -f docker/Dockerfile --build-arg "BASE_IMAGE=$BASE")
flags+=(--build-arg "GIT_SHA=$GIT_SHA")
pip_flags=(-v /etc/ssl/certs:/etc/ssl/certs:ro)  # the host's CA bundle: pip behind a TLS proxy
if [ -d /opt/pypi-more/simple ]; then
    pip_flags+=(-v /opt/pypi:/opt/pypi:ro -v /opt/pypi-more:/opt/pypi-more:ro
        --build-arg TORCH_INDEX_URL=file:///opt/pypi-more/simple
        --build-arg PIP_INDEX_URL=file:///opt/pypi-more/simple
        --build-arg "PIP_EXTRA_INDEX_URL=file:///opt/pypi/simple https://pypi.org/simple")
fi
build() {  # build target $1 as $2 (more flags after), then drop the image it replaced (7 GB
    local before target=$1 tag=$2  # each, else they pile up)
    shift 2
    before=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    podman build -q "${flags[@]}" "$@" --target "$target" -t "$tag" . >/dev/null
    if [ -n "$before" ] && [ "$before" != "$(podman image inspect --format '{{.Id}}' "$tag")" ]; then
        podman rmi "$before" >/dev/null 2>&1 || true  # still used by a container: leave it
    fi
}
build app localhost/dask-train-cifar:latest "${pip_flags[@]}"
podman tag localhost/dask-train-cifar:latest "localhost/dask-train-cifar:$GIT_SHA"
build services localhost/dask-train-cifar-services:latest "${pip_flags[@]}"
podman tag localhost/dask-train-cifar-services:latest "localhost/dask-train-cifar-services:$GIT_SHA"
build seaweedfs localhost/dask-train-cifar-s3:latest "${pip_flags[@]}"
# apt only (the CA bundle's mount would make ssl-cert's setup fail: it writes /etc/ssl/certs)
build postgres localhost/dask-train-cifar-postgres:latest
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep dask-train-cifar
