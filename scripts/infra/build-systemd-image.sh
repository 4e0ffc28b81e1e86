#!/usr/bin/env bash
# Build a Debian bookworm rootfs tarball for a systemd container (the Ansible test target), ready for
# `docker import`. No registry is needed: debootstrap from the Debian mirror, everything the roles need in
# air-gapped mode preinstalled (python3-venv for the exporter's venv, node-exporter, prometheus).
#
#   scripts/infra/build-systemd-image.sh OUT.tar [MIRROR]
#
# Needs root and debootstrap; takes 2-4 minutes, so callers cache OUT.tar (outside the repository).
set -euo pipefail
out="${1:?usage: build-systemd-image.sh OUT.tar [MIRROR]}"
mirror="${2:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debootstrap not found (apt-get install debootstrap)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "build-systemd-image.sh needs root (debootstrap)" >&2; exit 2; }
root="$(mktemp -d /tmp/js-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,python3,python3-venv,python3-apt,iproute2,procps,ca-certificates,prometheus-node-exporter,prometheus \
  bookworm "$root" "$mirror" >&2
# A container has no consoles or udev to wait for; keep boot quick and quiet.
for unit in getty.target console-getty.service systemd-udevd.service systemd-udev-trigger.service \
            systemd-resolved.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
echo "joulesched-target" > "$root/etc/hostname"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" --numeric-owner -cf "$out.partial" .
mv "$out.partial" "$out"
echo "wrote $out" >&2
