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
# docker/constraints.txt change. Package indexes and the Debian mirror come from the variables
# the user sets (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, TORCH_INDEX_URL, DEBIAN_MIRROR), else from
# this host's own configuration (`pip config`, apt's sources), else the tools' defaults;
# `bash docker/build-local.sh --show-sources` prints them and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
# runc and cgroupfs, as this kind of machine needs (docker/podman-containers.conf)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/docker/podman-containers.conf}
BASE=localhost/debian-py:bookworm
host_debian_mirror() {  # the host's Debian archive, as apt's sources name it (none: not Debian)
    sed -n 's|^URIs: *\([^ ]*/debian\)/*$|\1|p' /etc/apt/sources.list.d/debian.sources 2>/dev/null
    awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2 }' /etc/apt/sources.list 2>/dev/null
    true
}
mirror=${DEBIAN_MIRROR:-$(host_debian_mirror | head -n1 || true)}  # empty: debootstrap's default
pip_flags=(-v /etc/ssl/certs:/etc/ssl/certs:ro)  # the host's CA bundle: pip behind a TLS proxy
host_pip() {  # a setting of the host's pip configuration (its files and PIP_CONFIG_FILE)
    python3 -m pip config list 2>/dev/null | sed -n "s/^global\.$1='\(.*\)'\$/\1/p" | tail -n1 || true
}
index=${PIP_INDEX_URL:-$(host_pip index-url)}
extra=$(echo ${PIP_EXTRA_INDEX_URL:-$(host_pip extra-index-url)})  # one line
# torch from the host's indexes when it names any (they hold what its own installs use), else
# from the Dockerfile's default (PyTorch's CPU index)
torch=${TORCH_INDEX_URL:-$(printf '%s\n' $index $extra | head -n1)}
[ -z "$index" ] || pip_flags+=(--build-arg "PIP_INDEX_URL=$index")
[ -z "$extra" ] || pip_flags+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra")
[ -z "$torch" ] || pip_flags+=(--build-arg "TORCH_INDEX_URL=$torch")
for url in $(printf '%s\n' $index $extra $torch | sort -u); do  # a local index: mounted as it is
    case $url in file://*)
        folder=$(dirname "${url#file://}")  # the index's simple/ and the files it links to
        pip_flags+=(-v "$folder:$folder:ro") ;;
    esac
done
if [ "${1:-}" = --show-sources ]; then  # what a build here would use, and nothing built
    printf 'debian mirror: %s\n' "${mirror:-the default of debootstrap}"
    printf 'build flags: %s\n' "${pip_flags[*]}"
    exit 0
fi
if ! podman image exists "$BASE"; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$root" ${mirror:+"$mirror"} >/dev/null
    tar -C "$root" -c . | podman import - "$BASE" >/dev/null
fi
GIT_SHA=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
flags=(--network=host -f docker/Dockerfile --build-arg "BASE_IMAGE=$BASE")
flags+=(--build-arg "GIT_SHA=$GIT_SHA")
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
