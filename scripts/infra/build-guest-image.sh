#!/usr/bin/env bash
# Build a Debian bookworm guest for QEMU/libvirt: OUTDIR/rootfs.raw (ext4, 3 GiB), OUTDIR/vmlinuz and
# OUTDIR/initrd.img for direct kernel boot. cloud-init (NoCloud) gives it its user, SSH key and host key per run;
# everything the roles install in air-gapped mode is preinstalled (no network in the guest).
#
#   scripts/infra/build-guest-image.sh OUTDIR [MIRROR]
#
# Needs root, debootstrap and e2fsprogs; about 2-4 minutes, so callers cache OUTDIR (outside the repository).
set -euo pipefail
out="${1:?usage: build-guest-image.sh OUTDIR [MIRROR]}"
mirror="${2:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debootstrap not found (apt-get install debootstrap)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "build-guest-image.sh needs root (debootstrap)" >&2; exit 2; }
mkdir -p "$out"
root="$(mktemp -d /tmp/js-guest.XXXXXX)"
trap 'rm -rf "$root"' EXIT
# python3-cffi-backend is named explicitly: debootstrap cannot resolve it on its own.
debootstrap --variant=minbase \
  --include=linux-image-amd64,systemd-sysv,openssh-server,python3,python3-apt,python3-venv,dbus,iproute2,procps,sudo,ca-certificates,cloud-init,python3-cffi-backend,prometheus-node-exporter \
  bookworm "$root" "$mirror" >&2
echo "joulesched-guest" > "$root/etc/hostname"
echo "/dev/vda / ext4 defaults 0 1" > "$root/etc/fstab"
mkdir -p "$root/etc/systemd/network"
cat > "$root/etc/systemd/network/50-dhcp.network" <<'UNIT'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
UNIT
ln -sf /lib/systemd/system/systemd-networkd.service "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
# Only NoCloud: no waiting for metadata services that do not exist here.
echo "datasource_list: [ NoCloud, None ]" > "$root/etc/cloud/cloud.cfg.d/90-joulesched.cfg"
# Host keys come from cloud-init per run; none are baked into the image.
rm -f "$root"/etc/ssh/ssh_host_*
cp -L "$root/vmlinuz" "$out/vmlinuz.partial" && mv "$out/vmlinuz.partial" "$out/vmlinuz"
cp -L "$root/initrd.img" "$out/initrd.img.partial" && mv "$out/initrd.img.partial" "$out/initrd.img"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
rm -f "$out/rootfs.raw.partial"
mke2fs -q -t ext4 -d "$root" "$out/rootfs.raw.partial" 3G
mv "$out/rootfs.raw.partial" "$out/rootfs.raw"
echo "wrote $out" >&2
