#!/usr/bin/env bash
# tests/device/fetch-debs.sh — download, here, the Debian packages the build needs into
# .device-debs/ (ignored by git), for a GPU machine that reaches no package registry: the device
# run carries the folder and tests/device/run.sh unpacks it into a private prefix (never into /).
# About 22 MB. Run from anywhere; needs apt-get (Debian 12, as scripts/setup).
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES=(
  libcjson1 libcjson-dev                                           # JSON
  libglpk40 libglpk-dev libamd2 libcolamd2 libsuitesparseconfig5 libltdl7 libgmp10   # GLPK
  libopenblas0 libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5  # BLAS
  libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libevent-2.1-7 libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1
  libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libnuma1 libmunge2   # Open MPI
  libmetis5 libmetis-dev                                           # METIS
  libcmocka0 libcmocka-dev                                         # unit tests build
  pkgconf pkgconf-bin libpkgconf3                                  # pkg-config for meson
)
mkdir -p .device-debs
cd .device-debs
apt-get download "${PACKAGES[@]}" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' || true
echo "fetch-debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in .device-debs/"
