#!/usr/bin/env bash
# Build a Debian bookworm rootfs tarball for a systemd container (the Ansible test target), ready for
# `docker import`. No registry is needed: debootstrap from the Debian mirror, everything the roles need in
# air-gapped mode preinstalled (python3-venv for the exporter's venv, node-exporter, prometheus, and JMeter with
# a headless JRE for the jmeter role, installed with apt inside the rootfs: debootstrap cannot resolve Java).
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
cleanup() { umount "$root/proc" 2>/dev/null || true; rm -rf "$root"; }
trap cleanup EXIT
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,python3,python3-venv,python3-apt,iproute2,procps,ca-certificates,prometheus-node-exporter,prometheus \
  bookworm "$root" "$mirror" >&2
# Java's postinst runs java (it needs /proc); policy-rc.d keeps every service stopped in the chroot.
mount -t proc proc "$root/proc"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d" && chmod 755 "$root/usr/sbin/policy-rc.d"
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  default-jre-headless jmeter jmeter-http >&2
rm -f "$root/usr/sbin/policy-rc.d"
umount "$root/proc"
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
