#!/usr/bin/env bash
# setup.sh: installs what starling needs on Debian 12 (only the packages that
# are missing, with apt-get) and builds it into build/ (or $ST_BUILD_DIR).
#
#   tools/scripts/setup.sh            install + build (CUDA backend when nvcc exists)
#   ST_CMAKE_ARGS="-DSTARLING_CUDA=OFF" tools/scripts/setup.sh
#
# Used by tools/scripts/demo.sh and tools/scripts/test.sh; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=(build-essential cmake pkg-config libuv1-dev libsodium-dev
          libmsgpack-dev check libopenblas-dev zlib1g-dev libmicrohttpd-dev
          libjansson-dev
          dataset-fashion-mnist)
# LAPACK's C interface: the Cholesky and pivoted-QR solves of `starling lstsq`.
packages+=(liblapacke-dev)
# Python packages: matplotlib draws `starling plot` (the demo's plot).
packages+=(python3 python3-matplotlib)
packages+=(${ST_EXTRA_PACKAGES:-})

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build=${ST_BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${ST_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)"
