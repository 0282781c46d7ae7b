#!/usr/bin/env bash
# Debian packages the real-component tests use (sshd, network namespaces, systemd tools, nspawn).
set -euo pipefail
# gcc, binutils and libc6-dev: toolchain.jit links a real shared object; python3: Debian's 3.11.2 runs the
# archive corpus as users run it. prometheus (with promtool) and prometheus-node-exporter: the health tests.
needed=(openssh-server openssh-client netcat-openbsd iproute2 systemd systemd-container debootstrap pigz curl
        util-linux procps git gcc binutils libc6-dev python3
        prometheus prometheus-node-exporter)
# python3-dev: the qualification tests build a real abi3 extension module (Python.h) with gcc
needed+=(python3-dev)
# nftables: the cluster pre-flight test drops a port inside one node's network namespace
needed+=(nftables)
missing=()
for pkg in "${needed[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "tests need these Debian packages (run as root to install them): ${missing[*]}" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
