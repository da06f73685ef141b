#!/usr/bin/env bash
# The test hosts' image: Debian bookworm with systemd as PID 1, sshd and python3, built locally
# (no registry is reachable) with mmdebstrap. Prints the image name.
# Fast on re-runs: present in podman -> nothing; else loaded from $HICACHE_CACHE/images; else built
# (about a minute) and saved there. The tag carries the hash of this script and of the files it puts in the image, so
# editing any of them rebuilds.
# Test bed only, for speed: python3 keeps the bytecode of Ansible's module payloads (testbed_pyc/, as in the VM image):
# zipimport compiled them from source on every task, about a third of a stat task's CPU here (0.32 s, 0.22 s with it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${HICACHE_CACHE:-$HOME/.cache/hicache-deploy}/images"
tag="$(cat "$here/base_image.sh" "$here"/testbed_pyc/* | sha256sum | cut -c1-12)"
image="localhost/hicache-testhost:$tag"
saved="$cache/hicache-testhost-$tag.tar.zst"

if podman image exists "$image"; then echo "$image"; exit 0; fi
mkdir -p "$cache"
if [ -f "$saved" ]; then
  zstd -dc "$saved" | podman load -q >/dev/null
  echo "$image"; exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mirror=()
[ -f /etc/apt/sources.list.d/debian.sources ] && mirror=(/etc/apt/sources.list.d/debian.sources)
echo "base_image: building $image with mmdebstrap" >&2
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-apt,systemd,systemd-sysv,dbus,openssh-server,sudo,iproute2,procps,ca-certificates \
  --customize-hook='truncate -s 0 "$1/etc/machine-id"' \
  --customize-hook='chroot "$1" systemctl mask systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket getty@tty1.service console-getty.service serial-getty@.service' \
  --customize-hook='chroot "$1" systemctl enable ssh.service' \
  --customize-hook='install -d -m 0700 "$1/root/.ssh"' \
  --customize-hook='upload '"$here"'/testbed_pyc/hicache_testbed_pyc.py "/usr/lib/python3/dist-packages/hicache_testbed_pyc.py"' \
  --customize-hook='upload '"$here"'/testbed_pyc/hicache-testbed-pyc.pth "/usr/lib/python3/dist-packages/hicache-testbed-pyc.pth"' \
  bookworm "$work/rootfs.tar" "${mirror[@]}"
podman import -q --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL=SIGRTMIN+3' "$work/rootfs.tar" "$image" >/dev/null
podman save -q "$image" | zstd -q -3 -o "$saved.part" && mv "$saved.part" "$saved"
echo "$image"
