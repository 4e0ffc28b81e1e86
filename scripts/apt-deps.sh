#!/usr/bin/env bash
# Install the Debian packages the integration tests need, only those that are missing.
# Without root or apt-get, say so and carry on: the tests that need them skip and say why.
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "apt-deps: cannot install ${missing[*]} (need root and apt-get); tests that need them will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "apt-deps: installing ${missing[*]}"
# Packages such as prometheus and openssh-server start their daemon on install, listening on every address.
# The tests start what they need themselves, on loopback, so forbid service starts during the install
# (unless the machine already has its own policy).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
