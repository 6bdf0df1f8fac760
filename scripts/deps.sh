#!/usr/bin/env bash
# Installs what building and testing kiln needs, when it is missing (Debian; run as root).
# The CUDA toolkit is optional: without nvcc the CUDA targets are simply not configured.
set -euo pipefail
need=()
[ -f /usr/include/doctest/doctest.h ] || need+=(doctest-dev)
[ -f /usr/include/zlib.h ] || need+=(zlib1g-dev)
# JPEG and PNG decoding for image folders (kiln/data/image.hpp).
[ -f /usr/include/jpeglib.h ] || need+=(libjpeg62-turbo-dev)
[ -f /usr/include/png.h ] || need+=(libpng-dev)
ls /usr/include/x86_64-linux-gnu/openblas*/cblas.h >/dev/null 2>&1 || [ -f /usr/include/cblas.h ] || need+=(libopenblas-dev)
# MPI for data-parallel jobs (kiln/dist/): mpirun and the headers and library to build against.
command -v mpirun >/dev/null || need+=(openmpi-bin)
[ -f /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || [ -f /usr/include/mpi.h ] || need+=(libopenmpi-dev)
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "kiln needs these Debian packages: ${need[*]} (run as root or install them)" >&2
    exit 1
  fi
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q "${need[@]}" >/dev/null
fi
# nvcc lives outside PATH on some machines.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "export PATH=/usr/local/cuda/bin:\$PATH"
fi
