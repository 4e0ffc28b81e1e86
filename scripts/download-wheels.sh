#!/usr/bin/env bash
# Download the wheels an image installs offline: for CPython 3.11 on glibc x86_64 (what the images run, whatever
# this host is), binary only, into DEST. pip skips what DEST already holds, so a cached wheelhouse refreshes fast.
#
#   scripts/download-wheels.sh DEST REQUIREMENTS.txt     (PYTHON: the interpreter whose pip downloads)
set -euo pipefail
dest="${1:?usage: download-wheels.sh DEST REQUIREMENTS}"
reqs="${2:?usage: download-wheels.sh DEST REQUIREMENTS}"
python="${PYTHON:-python3}"
# TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu): an extra index for torch's CPU wheel, where pip's own
# indexes would give the CUDA build (PyPI's Linux wheels are CUDA builds).
extra=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then extra=(--extra-index-url "$TORCH_INDEX_URL"); fi
mkdir -p "$dest"
"$python" -m pip download --quiet --dest "$dest" --only-binary=:all: ${extra[@]+"${extra[@]}"} \
  --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -r "$reqs"
