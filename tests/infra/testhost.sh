#!/usr/bin/env bash
# Test hosts: systemd containers with sshd published on 127.0.0.1, reached with one SSH key.
#   testhost.sh up NAME PORT KEY      start (or replace) NAME; wait until root@127.0.0.1:PORT answers over SSH;
#                                     PORT 0 lets podman choose; the port is printed
#   testhost.sh stop NAME | start NAME   take a host away and bring it back (same port, same state)
#   testhost.sh down NAME...          remove hosts
#   testhost.sh clean                 remove every test host left by an interrupted run
# KEY is a private key file; KEY.pub becomes root's authorized_keys. TESTHOST_CAPS (e.g. "NET_ADMIN")
# adds capabilities to the container; TESTHOST_VOLUMES (e.g. "/srv/x:/mnt/shared") bind-mounts host directories
# into it (one directory mounted into several hosts is a shared "export").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
label="io.hicache-deploy.testhost=1"

wait_ssh() {  # port key
  for _ in $(seq 1 120); do
    if ssh -q -i "$2" -p "$1" -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o ConnectTimeout=2 root@127.0.0.1 true 2>/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "testhost: no SSH on 127.0.0.1:$1 after 60 s" >&2
  return 1
}

case "${1:-}" in
  up)
    name="$2" port="$3" key="$4"
    image="$("$here/base_image.sh" | tail -n 1)"
    podman rm -f -t 0 "$name" >/dev/null 2>&1 || true
    [ "$port" != 0 ] || port=""
    caps=()
    for cap in ${TESTHOST_CAPS:-}; do caps+=(--cap-add "$cap"); done
    for volume in ${TESTHOST_VOLUMES:-}; do caps+=(-v "$volume"); done
    podman run -d --name "$name" --hostname "$name" --label "$label" "${caps[@]}" \
      -p "127.0.0.1:$port:22" -v "$key.pub:/root/.ssh/authorized_keys:ro" "$image" >/dev/null
    port="$(podman port "$name" 22/tcp | head -n 1 | sed 's/.*://')"
    wait_ssh "$port" "$key"
    echo "$port"
    ;;
  stop) podman stop -t 5 "$2" >/dev/null ;;
  start)
    podman start "$2" >/dev/null
    port="$(podman port "$2" 22/tcp | head -n 1 | sed 's/.*://')"
    key="$(podman inspect -f '{{range .Mounts}}{{if eq .Destination "/root/.ssh/authorized_keys"}}{{.Source}}{{end}}{{end}}' "$2")"
    wait_ssh "$port" "${key%.pub}"
    ;;
  down) shift; [ $# -eq 0 ] || podman rm -f -t 0 "$@" >/dev/null ;;
  clean) podman ps -aq --filter "label=$label" | xargs -r podman rm -f -t 0 >/dev/null ;;
  *) echo "usage: testhost.sh up NAME PORT KEY | stop NAME | start NAME | down NAME... | clean" >&2; exit 2 ;;
esac
