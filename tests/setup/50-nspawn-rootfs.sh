#!/usr/bin/env bash
# A Debian bookworm root with systemd, booted by systemd-nspawn in the tests that need a real systemd
# (tests/harness/nspawn.py). Built once with debootstrap (~1 min, ~320 MB) and cached; every boot uses
# --volatile=overlay, so the cached tree is never modified.
set -euo pipefail
# libnuma1: the vLLM CPU engine's _C extension links it (the tests run the engine inside).
packages=systemd,systemd-sysv,dbus,python3,passwd,procps,iproute2,openssh-server,netcat-openbsd,libnuma1
cache="$ROCMDOCTOR_TEST_CACHE/nspawn-rootfs"
want="bookworm minbase $packages"
if [ "$(cat "$cache/.rocmdoctor-rootfs" 2>/dev/null)" = "$want" ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
    echo "building the nspawn root needs root (debootstrap)" >&2
    exit 1
fi
staging="$ROCMDOCTOR_TEST_CACHE/.nspawn-rootfs.staging"
rm -rf "$staging"
# The mirror this machine's apt already uses (deb822 or one-line sources); debootstrap's own default otherwise.
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)[[:space:]]*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
debootstrap --variant=minbase --include="$packages" bookworm "$staging" ${mirror:+"$mirror"} >/dev/null
# A hostname in the shared base would leak into every container booted from it.
rm -f "$staging/etc/hostname"
echo "$want" > "$staging/.rocmdoctor-rootfs"
rm -rf "$cache"
mv "$staging" "$cache"
