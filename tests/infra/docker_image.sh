#!/usr/bin/env bash
# The root file system of the container image the VM tier's Docker tests run (tests/vm/test_vm_docker.py): Debian
# bookworm, variant minbase, with python3 — enough for SGLang's stand-in (tests/standin/sglang_standin.py) in its
# stdlib-only mode (no L3 backend: no torch, no SGLang wheel). Not an SGLang image. Built locally with mmdebstrap
# as a tar for `docker import` inside the VM (no registry is reachable from the VMs). Prints the tar's path.
# Re-runs are instant: the file name carries this script's hash, so editing the script rebuilds (about a minute).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${HICACHE_CACHE:-$HOME/.cache/hicache-deploy}/images"
tag="$(sha256sum "$here/docker_image.sh" | cut -c1-12)"
out="$cache/docker-rootfs-$tag.tar"
if [ -f "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$cache"
# mmdebstrap picks the output format from the name: it must end in .tar.
partial="$cache/docker-rootfs-$tag.partial.tar"
mirror=()
[ -f /etc/apt/sources.list.d/debian.sources ] && mirror=(/etc/apt/sources.list.d/debian.sources)
echo "docker_image: building $out with mmdebstrap (bookworm minbase + python3)" >&2
# The image runs bash and python3's standard library, nothing else: what neither uses is removed (perl, which only
# usrmerge needed, glibc's iconv modules, apt and dpkg's database), since the TCG guest digests every byte of it in
# `docker import` (this took the tar from 170 MB to about 100).
mmdebstrap --quiet --variant=minbase --include=python3 \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/locale/* "$1"/usr/share/i18n' \
  --customize-hook='rm -rf "$1"/usr/share/perl "$1"/usr/lib/x86_64-linux-gnu/perl "$1"/usr/lib/x86_64-linux-gnu/perl-base "$1"/usr/lib/x86_64-linux-gnu/libperl.so* "$1"/usr/bin/perl* "$1"/usr/lib/x86_64-linux-gnu/gconv "$1"/usr/lib/apt "$1"/usr/lib/x86_64-linux-gnu/libapt-* "$1"/usr/bin/apt* "$1"/var/lib/dpkg/info "$1"/var/cache/debconf "$1"/usr/share/zoneinfo "$1"/usr/share/common-licenses "$1"/usr/lib/python3.11/lib2to3 "$1"/usr/lib/python3.11/pydoc_data "$1"/usr/lib/python3.11/ensurepip' \
  bookworm "$partial" "${mirror[@]}"
mv "$partial" "$out"
find "$cache" -maxdepth 1 -name 'docker-rootfs-*.tar' -not -name "docker-rootfs-$tag.tar" -delete
echo "$out"
