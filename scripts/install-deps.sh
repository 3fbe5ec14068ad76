#!/bin/sh
# Installs what building and testing rankmem needs on Debian/Ubuntu.
# The CUDA toolkit is not installed here: configure finds it at
# /usr/local/cuda (or --with-cuda=DIR) and builds host-only without it.
set -e
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    autoconf automake libtool pkg-config make gcc g++ libc6-dev \
    libopenmpi-dev openmpi-bin >/dev/null
