#!/usr/bin/env bash
# Test hosts: systemd containers with sshd published on 127.0.0.1, reached with one SSH key.
#   testhost.sh up NAME PORT KEY      start (or replace) NAME; wait until root@127.0.0.1:PORT answers over SSH;
#                                     PORT 0 lets podman choose; the port is printed
#   testhost.sh stop NAME | start NAME   take a host away and bring it back (same port, same state)
#   testhost.sh down NAME...          remove hosts
#   testhost.sh clean                 remove the test hosts of this run (TESTHOST_RUN set), else those whose run
#                                     ended (their owner process is gone: left by an interrupted run); never the
#                                     hosts of a run still going (another user's, another checkout's)
#   testhost.sh clean --all           remove every test host of every run
# Each host is labelled with its run: TESTHOST_RUN when set, else its owner, the nearest process above this script
# that is a pytest, molecule or tests/run (else the caller; TESTHOST_OWNER names it), by pid and start time (a reused
# pid is another process).
# KEY is a private key file; KEY.pub becomes root's authorized_keys. TESTHOST_CAPS (e.g. "NET_ADMIN")
# adds capabilities to the container; TESTHOST_VOLUMES (e.g. "/srv/x:/mnt/shared") bind-mounts host directories
# into it (one directory mounted into several hosts is a shared "export").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
label="io.hicache-deploy.testhost=1"

start_time() {  # pid -> its start time in clock ticks since boot (/proc/PID/stat field 22), empty when it is gone
  [ -r "/proc/$1/stat" ] || return 0
  sed 's/^.*) //' "/proc/$1/stat" | cut -d' ' -f20
}

owner() {  # the process this host belongs to: TESTHOST_OWNER (a pid), else the nearest pytest, molecule or tests/run
  # above us, else our caller
  if [ -n "${TESTHOST_OWNER:-}" ]; then echo "$TESTHOST_OWNER"; return; fi
  local pid="$PPID"
  while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -Eq '(^|[ /])(pytest|py\.test|molecule|tests/run)( |$)|-m pytest'; then
      echo "$pid"; return
    fi
    pid="$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f2)"
  done
  echo "$PPID"
}

wait_ssh() {  # port key
  # up to 300 s: with every stream of tests/run busy, a Molecule host took longer than the 60 s this once waited
  local deadline=$((SECONDS + 300))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if ssh -q -i "$2" -p "$1" -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o ConnectTimeout=2 root@127.0.0.1 true 2>/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "testhost: no SSH on 127.0.0.1:$1 after 300 s" >&2
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
    owner_pid="$(owner)"
    run="${TESTHOST_RUN:-pid-$owner_pid-$(start_time "$owner_pid")}"
    podman run -d --name "$name" --hostname "$name" --label "$label" --label "io.hicache-deploy.run=$run" \
      --label "io.hicache-deploy.owner=$owner_pid:$(start_time "$owner_pid")" "${caps[@]}" \
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
  down) shift; [ $# -eq 0 ] || podman rm -f -i -t 0 "$@" >/dev/null ;;  # -i: a name already gone does not stop the others
  clean)
    if [ "${2:-}" = --all ]; then
      podman ps -aq --filter "label=$label" | xargs -r podman rm -f -t 0 >/dev/null
    elif [ -n "${TESTHOST_RUN:-}" ]; then
      podman ps -aq --filter "label=io.hicache-deploy.run=$TESTHOST_RUN" | xargs -r podman rm -f -t 0 >/dev/null
    else
      # hosts whose owner process is gone; a host without an owner label (made before runs were labelled) is kept
      podman ps -a --filter "label=$label" --format '{{.ID}} {{index .Labels "io.hicache-deploy.owner"}}' |
        while read -r id owned; do
          case "$owned" in ''|'<no value>') continue ;; esac
          pid="${owned%%:*}" started="${owned#*:}"
          [ -n "$started" ] || continue  # its owner's start time was not readable: it cannot be told apart, so kept
          [ "$(start_time "$pid")" = "$started" ] || podman rm -f -t 0 "$id" >/dev/null
        done
    fi
    ;;
  *) echo "usage: testhost.sh up NAME PORT KEY | stop NAME | start NAME | down NAME... | clean [--all]" >&2; exit 2 ;;
esac
