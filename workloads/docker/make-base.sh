#!/usr/bin/env bash
# Make a local base image tarball for the workload Dockerfiles when no registry is reachable:
# Debian bookworm minbase + python3 (3.11) + pip, as a rootfs tar ready for `docker import`.
#
#   workloads/docker/make-base.sh OUT.tar [MIRROR]
#
# Needs root and debootstrap; takes a few minutes, so callers cache OUT.tar.
set -euo pipefail
out="${1:?usage: make-base.sh OUT.tar [MIRROR]}"
mirror="${2:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "make-base.sh: debootstrap not found (apt-get install debootstrap)" >&2; exit 2; }
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-pip bookworm "$root" "$mirror" >&2
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" --numeric-owner -cf "$out.partial" .
mv "$out.partial" "$out"
