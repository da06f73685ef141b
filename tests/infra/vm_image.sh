#!/usr/bin/env bash
# The VM test hosts' image: Debian bookworm with Debian's own kernel (linux-image-amd64), systemd and udev, sshd,
# python3, the NFS client and server (nfs-common, nfs-kernel-server), rdma-core (Soft-RoCE: rdma_rxe) and the Docker
# engine (docker.io), built locally with mmdebstrap. Prints the directory holding vmlinuz, initrd.img and root.qcow2.
# `--packages`: only install what it needs (below). Re-runs are instant: the directory carries the hash of this script
# and of the files it puts in the image, so editing any of them rebuilds (about 3-4 minutes).
#
# Test bed only, for speed: the guest's python3 keeps the bytecode of what it compiles from a zip (Ansible's module
# payloads), as it keeps any file's in __pycache__ (testbed_pyc/, in the test-host image too): under TCG that
# compilation was about half of each task's guest CPU (6.5 s of a stat task, 3.6 s with the cache, measured here).
#
# The image knows no host: each VM gets its identity from the kernel command line (tests/infra/vm.py boots it with
# -kernel/-initrd/-append), read by hicache-testbed-identity.service at every boot:
#   hicache.sshkey=<base64 of an authorized_keys line>   root's authorized_keys
#   systemd.hostname=NAME                              (systemd's own)
# The management NIC (virtio, MAC 52:54:00:00:00:01) takes DHCP from QEMU's user network (restrict=on: no route out);
# everything else is configured by the tests over SSH and persists on the VM's own overlay disk.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${HICACHE_CACHE:-$HOME/.cache/hicache-deploy}/images"
tag="$(cat "$here/vm_image.sh" "$here"/vm_guest/* "$here"/testbed_pyc/* | sha256sum | cut -c1-12)"
out="$cache/vm-$tag"

# QEMU and the builders, from Debian. `vm_image.sh --packages` installs them and stops: tests/run does so before it
# builds the image beside other steps, so that no other apt-get waits on the dpkg lock meanwhile.
packages=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "vm_image: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "${1:-}" != --packages ] || exit 0
if [ -f "$out/.complete" ]; then echo "$out"; exit 0; fi

rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d "$cache/vm-build.XXXXXX")"
# A failed mmdebstrap can leave /proc, /sys or /dev mounted in the tree: unmount them before anything is removed,
# and never cross into another file system.
trap 'umount -R -l "$work/root" 2>/dev/null || true; findmnt -rn -o TARGET | grep -q "^$work/" || rm -rf --one-file-system "$work"' EXIT
mirror=()
[ -f /etc/apt/sources.list.d/debian.sources ] && mirror=(/etc/apt/sources.list.d/debian.sources)
include=linux-image-amd64,initramfs-tools,systemd,systemd-sysv,udev,dbus,kmod,openssh-server,python3,python3-apt,sudo
include+=,iproute2,procps,ethtool,pciutils,ca-certificates,nfs-common,nfs-kernel-server,rdma-core,ibverbs-providers
include+=,ibverbs-utils,docker.io,iptables,apparmor,e2fsprogs,util-linux
echo "vm_image: building $out with mmdebstrap (Debian's kernel, NFS, rdma-core, Docker)" >&2
mmdebstrap --variant=apt --include="$include" \
  --customize-hook='truncate -s 0 "$1/etc/machine-id"' \
  --customize-hook='upload '"$here"'/vm_guest/hicache-testbed-identity "/usr/local/sbin/hicache-testbed-identity"' \
  --customize-hook='upload '"$here"'/vm_guest/hicache-testbed-identity.service "/etc/systemd/system/hicache-testbed-identity.service"' \
  --customize-hook='upload '"$here"'/vm_guest/10-management.network "/etc/systemd/network/10-management.network"' \
  --customize-hook='chmod 0755 "$1/usr/local/sbin/hicache-testbed-identity"' \
  --customize-hook='upload '"$here"'/testbed_pyc/hicache_testbed_pyc.py "/usr/lib/python3/dist-packages/hicache_testbed_pyc.py"' \
  --customize-hook='upload '"$here"'/testbed_pyc/hicache-testbed-pyc.pth "/usr/lib/python3/dist-packages/hicache-testbed-pyc.pth"' \
  --customize-hook='chroot "$1" systemctl enable ssh.service systemd-networkd.service hicache-testbed-identity.service' \
  --customize-hook='chroot "$1" systemctl disable docker.service docker.socket containerd.service nfs-server.service' \
  --customize-hook='chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer e2scrub_reap.service nfs-blkmap.service systemd-binfmt.service' \
  --customize-hook='echo "/dev/vda / ext4 defaults 0 1" > "$1/etc/fstab"' \
  --customize-hook='install -d -m 0700 "$1/root/.ssh"' \
  --customize-hook='printf "MODULES=list\n" > "$1/etc/initramfs-tools/conf.d/hicache-testbed"; printf "virtio_pci\nvirtio_blk\next4\n" >> "$1/etc/initramfs-tools/modules"' \
  --customize-hook='chroot "$1" update-initramfs -u -k all' \
  --customize-hook='cp "$1"/boot/vmlinuz-* '"$work"'/vmlinuz; cp "$1"/boot/initrd.img-* '"$work"'/initrd.img' \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
  bookworm "$work/root" "${mirror[@]}"
# The root file system, made from the tree (no loop device, no partition table: the kernel mounts /dev/vda).
mkfs.ext4 -q -L root -d "$work/root" "$work/root.img" 6G
qemu-img convert -O qcow2 "$work/root.img" "$out/root.qcow2"
mv "$work/vmlinuz" "$work/initrd.img" "$out/"
touch "$out/.complete"
# Older builds of this script are of no more use.
find "$cache" -maxdepth 1 -name 'vm-*' -not -name "vm-$tag" -exec rm -rf {} +
echo "$out"
