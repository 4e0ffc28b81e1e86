#!/usr/bin/env bash
# Build the workload images from a local base, offline.
#
#   workloads/build.sh [--engine docker|podman] [--base IMAGE] [--prefix joulesched] [--tag latest]
#                      [--wheelhouse DIR] [APP ...]        (APP: cpu memory disk network combined testapp shop)
#
# The build context is a temp dir holding workloads/ and a wheelhouse; the Dockerfiles install from the
# wheelhouse with --no-index, so neither the build nor the image needs a registry. Without --wheelhouse the
# wheels are fetched once on this host (pip download) into ${XDG_CACHE_HOME:-~/.cache}/joulesched/wheelhouse.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine=docker
base=python:3.11-slim
prefix=joulesched
tag=latest
wheelhouse=""
python="${PYTHON:-python3}"
apps=()

die() { echo "build.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="${2:?}"; shift 2 ;;
    --base) base="${2:?}"; shift 2 ;;
    --prefix) prefix="${2:?}"; shift 2 ;;
    --tag) tag="${2:?}"; shift 2 ;;
    --wheelhouse) wheelhouse="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    cpu|memory|disk|network|combined|testapp|shop) apps+=("$1"); shift ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ ${#apps[@]} -gt 0 ] || apps=(cpu memory disk network combined testapp shop)
case "$engine" in docker|podman) ;; *) die "--engine must be docker or podman" ;; esac
command -v "$engine" >/dev/null || die "$engine not found"

if [ -z "$wheelhouse" ]; then
  wheelhouse="${XDG_CACHE_HOME:-$HOME/.cache}/joulesched/wheelhouse"
  PYTHON="$python" "$repo/scripts/download-wheels.sh" "$wheelhouse" "$repo/workloads/docker/requirements.txt"
fi
[ -d "$wheelhouse" ] || die "--wheelhouse $wheelhouse is not a directory"

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/wheels"
cp "$wheelhouse"/*.whl "$ctx/wheels/"
tar -C "$repo" --exclude=__pycache__ -cf - workloads | tar -C "$ctx" -xf -
# The joulesched wheel itself (installed in the image without its dependencies).
PYTHON="$python" "$repo/scripts/build-wheel.sh" "$ctx/wheels"

for app in "${apps[@]}"; do
  echo "building $prefix/$app:$tag from $base" >&2
  "$engine" build --quiet --build-arg "BASE=$base" -f "$ctx/workloads/docker/Dockerfile.$app" -t "$prefix/$app:$tag" "$ctx"
done
