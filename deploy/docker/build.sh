#!/usr/bin/env bash
# Build the scheduler image from a local base, offline.
#
#   deploy/docker/build.sh [--engine docker|podman] [--base IMAGE] [--tag joulesched:VERSION] [--wheelhouse DIR]
#
# The build context is a temp dir holding the Dockerfile, the joulesched wheel (scripts/build-wheel.sh), the
# runtime wheels (deploy/docker/requirements.txt) and models/. Without --wheelhouse the runtime wheels are
# downloaded once on this host into ${XDG_CACHE_HOME:-~/.cache}/joulesched/wheelhouse-scheduler.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3}"
version="$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")"
engine=docker
base=python:3.11-slim
tag="joulesched:$version"
wheelhouse=""

die() { echo "build.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="${2:?}"; shift 2 ;;
    --base) base="${2:?}"; shift 2 ;;
    --tag) tag="${2:?}"; shift 2 ;;
    --wheelhouse) wheelhouse="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$engine" in docker|podman) ;; *) die "--engine must be docker or podman" ;; esac
command -v "$engine" >/dev/null || die "$engine not found"

if [ -z "$wheelhouse" ]; then
  wheelhouse="${XDG_CACHE_HOME:-$HOME/.cache}/joulesched/wheelhouse-scheduler"
  PYTHON="$python" "$repo/scripts/download-wheels.sh" "$wheelhouse" "$repo/deploy/docker/requirements.txt"
fi
[ -d "$wheelhouse" ] || die "--wheelhouse $wheelhouse is not a directory"

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/wheels" "$ctx/models"
cp "$wheelhouse"/*.whl "$ctx/wheels/"
PYTHON="$python" "$repo/scripts/build-wheel.sh" "$ctx/wheels"
cp "$repo/deploy/docker/Dockerfile" "$repo/deploy/docker/requirements.txt" "$ctx/"
cp "$repo"/models/*.pt "$repo"/models/*.json "$ctx/models/"
echo "building $tag from $base" >&2
"$engine" build --quiet --build-arg "BASE=$base" -t "$tag" "$ctx"
echo "$tag"
