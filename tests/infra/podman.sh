#!/usr/bin/env bash
# Rootful Podman for the test bed, from Debian, configured for this VM kind (see
# ../shared/reference/containers.md): runc (the cgroup layout is hybrid; crun refuses it), cgroupfs,
# file event logger, and default ulimits inside the bounding set (no CAP_SYS_RESOURCE here).
# Idempotent: packages are installed once, the config is rewritten only when it differs.
set -euo pipefail
# fio beside them: `bench --tier` reads a tier with it where a host has it (tests/test_tier_bench.py runs it for real).
packages=(podman runc conmon netavark aardvark-dns containernetworking-plugins golang-github-containers-common
          iptables uidmap catatonit fuse-overlayfs slirp4netns mmdebstrap zstd openssh-client docker-registry fio)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "podman.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
nofile="$(ulimit -Hn)"
conf="[containers]
default_ulimits = [\"nofile=${nofile}:${nofile}\", \"nproc=16384:16384\"]

[engine]
runtime = \"runc\"
cgroup_manager = \"cgroupfs\"
events_logger = \"file\""
mkdir -p /etc/containers
if [ "$(cat /etc/containers/containers.conf 2>/dev/null)" != "$conf" ]; then
  printf '%s\n' "$conf" > /etc/containers/containers.conf
fi
podman info --format '{{.Host.OCIRuntime.Name}}' >/dev/null
