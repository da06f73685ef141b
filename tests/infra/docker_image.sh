#!/usr/bin/env bash
# The root file system of the container image the VM tier's Docker tests run (tests/vm/test_vm_docker.py): Debian
# bookworm, variant minbase, with python3 — enough for SGLang's stand-in (tests/standin/sglang_standin.py) in its
# stdlib-only mode (no L3 backend: no torch, no SGLang wheel). Not an SGLang image. Built locally with mmdebstrap
# as a tar for `docker import` inside the VM (no registry is reachable from the VMs). Prints the tar's path.
# Re-runs are instant: the file name carries this script's hash, so editing the script rebuilds (about 1-2 minutes).
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
mmdebstrap --quiet --variant=minbase --include=python3 \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/locale/* "$1"/usr/share/i18n' \
  bookworm "$partial" "${mirror[@]}"
mv "$partial" "$out"
find "$cache" -maxdepth 1 -name 'docker-rootfs-*.tar' -not -name "docker-rootfs-$tag.tar" -delete
echo "$out"
