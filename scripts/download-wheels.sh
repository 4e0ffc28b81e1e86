#!/usr/bin/env bash
# Download the wheels an image installs offline: for CPython 3.11 on glibc x86_64 (what the images run, whatever
# this host is), binary only, into DEST. pip skips what DEST already holds, so a cached wheelhouse refreshes fast.
#
#   scripts/download-wheels.sh DEST REQUIREMENTS.txt     (PYTHON: the interpreter whose pip downloads)
set -euo pipefail
dest="${1:?usage: download-wheels.sh DEST REQUIREMENTS}"
reqs="${2:?usage: download-wheels.sh DEST REQUIREMENTS}"
python="${PYTHON:-python3}"
mkdir -p "$dest"
"$python" -m pip download --quiet --dest "$dest" --only-binary=:all: \
  --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -r "$reqs"
