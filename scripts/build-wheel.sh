#!/usr/bin/env bash
# Build the joulesched wheel into OUTDIR from a copy of the package folders (pyproject.toml lists them), so the
# build leaves nothing (build/, *.egg-info) behind in the checkout.
#
#   scripts/build-wheel.sh OUTDIR        (PYTHON: the interpreter whose pip builds it; default python3)
set -euo pipefail
out="${1:?usage: build-wheel.sh OUTDIR}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
cp "$repo/pyproject.toml" "$repo/README.md" "$src/"
for pkg in $("$python" -c 'import sys, tomllib; d = tomllib.load(open(sys.argv[1], "rb"));
print(" ".join(sorted({p.split(".")[1] for p in d["tool"]["setuptools"]["packages"]})))' "$repo/pyproject.toml"); do
  tar -C "$repo" --exclude=__pycache__ -cf - "$pkg" | tar -C "$src" -xf -
done
mkdir -p "$out"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$out" "$src" >&2
