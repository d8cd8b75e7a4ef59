#!/bin/sh
# Python 3.11 on the Ubuntu 22.04 based images (CUDA, ROCm): deadsnakes' python3.11 and a
# virtual environment in /opt/venv (those images put /opt/venv/bin first on PATH).
# Usage: ubuntu-python.sh [MORE_APT_PACKAGES ...]
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends ca-certificates gpg-agent software-properties-common
add-apt-repository -y ppa:deadsnakes/ppa
apt-get update
apt-get install -y --no-install-recommends python3.11 python3.11-venv libgomp1 "$@"
rm -rf /var/lib/apt/lists/*
python3.11 -m venv /opt/venv
/opt/venv/bin/pip install --upgrade pip
