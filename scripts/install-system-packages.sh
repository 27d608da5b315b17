#!/usr/bin/env bash
# Installs the Debian packages the project needs, only when some are missing (idempotent).
set -euo pipefail

# libusb-1.0-0: the C library under python-libusb1 (usb1) and pyusb.
# umockdev, libumockdev0, gir1.2-umockdev-1.0: an emulated USB device behind real libusb, for the
# emulated-USB tests (tests/umockdev, run under umockdev-wrapper).
# libgirepository1.0-dev, libcairo2-dev, pkg-config: to build PyGObject ("PyGObject<3.51", the
# `umockdev` extra) from source; it reaches umockdev through GObject introspection.
packages=(
  libusb-1.0-0
  umockdev libumockdev0 gir1.2-umockdev-1.0
  libgirepository1.0-dev libcairo2-dev pkg-config
)

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing system packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
