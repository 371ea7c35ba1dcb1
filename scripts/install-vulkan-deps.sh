#!/usr/bin/env bash
# The Debian packages a Vulkan build of llama.cpp and its runs on Mesa's lavapipe need:
#   glslc spirv-headers libvulkan-dev   to build (libvulkan-dev: the loader to link; its headers
#                                       may be too old: the build then fetches Debian 13's, pinned
#                                       in checksums/vulkan-headers.sha256)
#   mesa-vulkan-drivers                 lavapipe: a Vulkan device on the CPU, where there is no GPU
#   vulkan-tools                        vulkaninfo: which devices there are (doctor, serve's refusal)
# Idempotent: installs only what `dpkg-query` says is missing, and says so; nothing to do is one line.
# Needs root (or sudo) only when something is missing. Not Debian/Ubuntu: one `error:` line.
set -euo pipefail
PACKAGES=(glslc spirv-headers libvulkan-dev mesa-vulkan-drivers vulkan-tools)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "vulkan deps: ${PACKAGES[*]} already installed"
    exit 0
fi
command -v apt-get >/dev/null 2>&1 || { echo "error: apt-get not found; install ${missing[*]} (or their equivalents) with this system's package manager" >&2; exit 1; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "error: installing ${missing[*]} needs root; run: apt-get install ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
echo "vulkan deps: installing ${missing[*]} with apt-get"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "vulkan deps: installed ${missing[*]}"
