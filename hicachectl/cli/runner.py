"""Run a playbook through ansible-runner and turn its events into per-host results."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any

from hicachectl.config.inventory import ROUTERS
from hicachectl.config.paths import ANSIBLE_CFG, CALLBACK_PLUGINS, PLAYBOOKS, AnsibleConfigFile, ansible_config, collections_dir  # noqa: F401


@dataclasses.dataclass
class Change:
    task: str
    item: str | None
    diff: list[dict[str, Any]]


@dataclasses.dataclass
class Record:
    """One task's word about a host: a gap (asked for, not done, tolerated), a skip (not asked for), a failure
    (`item`: the loop item that failed, e.g. which router)."""
    task: str
    reason: str
    item: str | None = None
    # a gap only (hicache_gap's hicache_gap_outcome): the state was read and does not meet the request (else the check
    # could not be made), and why it is tolerated
    checked: bool = False
    why_tolerated: str = "hicache_strict is false"

    def __str__(self) -> str:
        return f"{self.task} ({self.item}): {self.reason}" if self.item else f"{self.task}: {self.reason}"

    def as_dict(self) -> dict[str, str]:
        # No "item" where there is none: gaps and skips keep the JSON shape they always had.
        return {"task": self.task, "reason": self.reason} | ({"item": self.item} if self.item else {})


@dataclasses.dataclass
class Note:
    """What a task told the operator about a host (hicache_note), or what hicachectl did for it (a lock released)."""
    task: str
    text: str

    def __str__(self) -> str:
        return self.text  # the operator reads the note alone, as it always was shown


# A host's outcome is one of unreachable, failed, interrupted (the run ended before the host finished), not run (the run
# never reached it), degraded (it ran, with gaps its inventory tolerates: hicache_strict false), changed, ok. These are good:
GOOD = ("ok", "changed", "degraded")


@dataclasses.dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False
    interrupted: bool = False
    reached: bool = False  # an event of the run's last play named the host
    failures: list[Record] = dataclasses.field(default_factory=list)  # a failed task, or "unreachable"
    changes: list[Change] = dataclasses.field(default_factory=list)
    gaps: list[Record] = dataclasses.field(default_factory=list)
    skips: list[Record] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # what set_fact / modules returned as ansible_facts
    notes: list[Note] = dataclasses.field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        """The failures as text, one "task: reason" each (what --json has always called "reasons")."""
        return [str(f) for f in self.failures]

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.interrupted:
            return "interrupted"
        if self.failed:
            return "failed"
        if not self.reached:
            return "not run"
        if self.gaps:
            return "degraded"
        return "changed" if self.changed else "ok"

    @property
    def good(self) -> bool:
        return self.status in GOOD

    def as_dict(self) -> dict[str, Any]:
        """The host for --json: the keys it has always had, where they were ("reasons" and "notes" as text, gaps and
        skips without an "item"), then the records behind the text ("failures", "note_records")."""
        out = {("reasons" if name == "failures" else name): value for name, value in dataclasses.asdict(self).items()}
        out["reasons"] = self.reasons
        out["gaps"], out["skips"] = [r.as_dict() for r in self.gaps], [r.as_dict() for r in self.skips]
        out["notes"] = [note.text for note in self.notes]
        out["status"] = self.status
        out["failures"] = [r.as_dict() for r in self.failures]
        out["note_records"] = [dataclasses.asdict(note) for note in self.notes]
        return out


@dataclasses.dataclass
class RunResult:
    rc: int
    hosts: dict[str, HostResult]
    interrupted: str | None = None  # why the run ended before its final stats, if it did

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and self.interrupted is None and all(h.good for h in self.hosts.values())


Progress = Callable[[str, str, str], None]  # host, task, status
# Steps that can take minutes (a big model loads for 10+): reported as running once they have run this
# long (ansible-runner announces a task before its condition is evaluated, so not at once).
LONG_ACTIONS = ("hicache_wait_healthy",)
LONG_AFTER_SECONDS = 2.0


def _item_label(res: dict[str, Any]) -> str | None:
    label = res.get("_ansible_item_label", res.get("item"))
    if isinstance(label, dict):
        label = label.get("name", str(label))
    return None if label is None else str(label)


class _Collector:
    def __init__(self, progress: Progress | None, routers: Iterable[str] = ()):
        self.hosts: dict[str, HostResult] = {}
        self.routers = set(routers)  # router hosts: their work is the routers' play, a server's the servers' last play
        self.progress = progress
        self.running: dict[tuple[str, str], threading.Timer] = {}
        self.finished = False  # the final stats event arrived
        self.play = ""  # the play under way
        self.routers_play = False  # whether it is the routers' play (hosts: hicache_routers)

    def host(self, name: str) -> HostResult:
        return self.hosts.setdefault(name, HostResult(name))

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host_name = data.get("host")
        task = data.get("task", "")
        res = data.get("res") or {}
        if host_name and kind.startswith("runner_on_") and kind != "runner_on_start" and (host_name, task) in self.running:
            self.running.pop((host_name, task)).cancel()
        if kind == "playbook_on_play_start":
            # "reached" means reached by the last play (the one that does the work): a host that an earlier play
            # (validate, lock and pull) saw but a stopped rollout never deployed is "not run", not ok. With
            # serial, ansible-runner repeats a play's uuid with a _N suffix per batch: the same play.
            # A play for the routers (hosts: hicache_routers) restarts the count of the routers only, any other play
            # that of the servers only: a deploy's routers' play, last, must not make every server "not run".
            play = str(data.get("play_uuid", "")).split("_")[0]
            if play != self.play:
                self.play = play
                self.routers_play = str(data.get("play_pattern", "")) == ROUTERS
                for host in self.hosts.values():
                    if (host.host in self.routers) == self.routers_play:
                        host.reached = False
        # A router counts as reached only by the routers' play (validate's run-once tasks may name it first).
        if host_name and kind.startswith("runner_"):
            self.host(host_name).reached |= host_name not in self.routers or self.routers_play
        if kind == "playbook_on_stats":
            self.finished = True
            self._stats(data)
        elif host_name and kind == "runner_on_start" and str(data.get("task_action", "")).endswith(LONG_ACTIONS):
            timer = threading.Timer(LONG_AFTER_SECONDS, self._tell, (host_name, task, "running"))
            timer.daemon = True
            self.running[host_name, task] = timer
            timer.start()
        elif host_name and kind in ("runner_on_ok", "runner_item_on_ok"):
            if res.get("hicache_note"):
                self.host(host_name).notes.append(Note(task, str(res["hicache_note"])))
            outcome = res.get("hicache_gap_outcome") if isinstance(res.get("hicache_gap_outcome"), dict) else {}
            for gap in res.get("hicache_gaps") or []:
                self.host(host_name).gaps.append(Record(task, str(gap), checked=bool(outcome.get("checked")),
                                                        why_tolerated=str(outcome.get("why_tolerated") or Record.why_tolerated)))
            if isinstance(res.get("ansible_facts"), dict):
                self.host(host_name).facts.update(res["ansible_facts"])
            if res.get("changed") and "results" not in res:
                self.host(host_name).changes.extend(_changes(task, res, kind))
            long_step = str(data.get("task_action", "")).endswith(LONG_ACTIONS)
            self._tell(host_name, task, "changed" if res.get("changed") else ("done" if long_step else "ok"))
        elif host_name and kind in ("runner_on_failed", "runner_item_on_failed") and not data.get("ignore_errors"):
            failures = self.host(host_name).failures
            message = _message(res)
            label = _item_label(res) if kind == "runner_item_on_failed" else None  # which loop item: e.g. which router
            if not any(f.reason == message for f in failures):  # a rescue that re-raises repeats the cause
                failures.append(Record(task, message, label))
            self._tell(host_name, task, "failed")
        elif host_name and kind == "runner_on_unreachable":
            self.host(host_name).failures.append(Record("unreachable", _message(res)))
            self._tell(host_name, task, "unreachable")
        return True

    def _tell(self, host: str, task: str, status: str) -> None:
        if self.progress:
            self.progress(host, task, status)

    def _stats(self, data: dict[str, Any]) -> None:
        for field, attr in (("ok", "ok"), ("changed", "changed"), ("failures", "failed"), ("skipped", "skipped")):
            for host, count in (data.get(field) or {}).items():
                setattr(self.host(host), attr, count)
        for host in data.get("dark") or {}:
            self.host(host).unreachable = True


def _changes(task: str, res: dict[str, Any], kind: str) -> list[Change]:
    """What one changed result changed: a loop item, or each item a module names (hicache_files' changed_items,
    several files written in one step), or the task itself."""
    if kind == "runner_item_on_ok":
        return [Change(task, _item_label(res), _diffs(res))]
    items = res.get("changed_items") or []
    if items:
        return [Change(task, str(item), [d for d in _diffs(res) if str(d.get("after_header", "")).endswith(f"/{item}")]) for item in items]
    return [Change(task, None, _diffs(res))]


def _diffs(res: dict[str, Any]) -> list[dict[str, Any]]:
    diff = res.get("diff") or []
    return diff if isinstance(diff, list) else [diff]


def _message(res: dict[str, Any]) -> str:
    msg = res.get("msg") or res.get("stderr") or res.get("reason") or "failed"
    if isinstance(msg, list):
        msg = "; ".join(map(str, msg))
    return str(msg).strip()


@contextlib.contextmanager
def _cancel_on_signals():
    """SIGINT/SIGTERM stop the playbook through ansible-runner (not this process mid-event), so the run
    ends as interrupted with its hosts named, and the CLI can release their locks."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    previous = {sig: signal.signal(sig, lambda number, _frame: received.append(number)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# The callbacks hicachectl's report needs (plugins/callback): the skips it files, the core loaded once per run.
HICACHE_CALLBACKS = ("hicache_skips", "hicache_preload")


def _joined(values: Iterable[str], sep: str) -> str:
    return sep.join(dict.fromkeys(str(v) for v in values if v))


def ansible_settings(config: AnsibleConfigFile | None = None) -> dict[str, str]:
    """The environment that makes ansible-playbook use the user's Ansible configuration (the file Ansible's own lookup
    finds from here, hicachectl.config.paths.ansible_config; hicachectl's ansible.cfg when there is none) with what hicachectl
    needs added to it, never in place of it: its callbacks' directory and names, its collection first on the
    collections path. Each is the file's value (or the user's ANSIBLE_* variable, which Ansible puts above the file)
    with ours joined to it: an ANSIBLE_* variable replaces the file's setting whole (ansible/config/manager.py), so
    ours alone would hide the user's callbacks and collections. ANSIBLE_CONFIG names the file, as ansible-runner runs
    ansible-playbook in the playbooks' directory, where its own lookup would miss a ./ansible.cfg of the user's."""
    from ansible.config.manager import ConfigManager

    config = config or ansible_config()
    manager = ConfigManager(str(config.path))

    def configured(name: str) -> list[str]:
        value = manager.get_config_value(name)
        return [value] if isinstance(value, str) else list(value or [])

    return {
        "ANSIBLE_CONFIG": str(config.path),
        # ansible-runner appends its own callback directory to this one (ansible_runner/config/_base.py).
        "ANSIBLE_CALLBACK_PLUGINS": _joined([str(CALLBACK_PLUGINS), *configured("DEFAULT_CALLBACK_PLUGIN_PATH")], os.pathsep),
        "ANSIBLE_CALLBACKS_ENABLED": _joined([*configured("CALLBACKS_ENABLED"), *HICACHE_CALLBACKS], ","),
        # hicache.deploy is this installation's own, ahead of any copy the user installed.
        "ANSIBLE_COLLECTIONS_PATH": _joined([str(collections_dir()), *configured("COLLECTIONS_PATHS")], os.pathsep),
    }


def run_playbook(playbook: str, inventory: pathlib.Path, *, limit: str | None = None, check: bool = False,
                 diff: bool = False, extravars: dict[str, Any] | None = None, tags: str | None = None,
                 progress: Progress | None = None, hosts: Iterable[str] = (), routers: Iterable[str] = ()) -> RunResult:
    """Run one playbook; `hosts` are the hosts it targets, each of which gets a result (\"not run\" if never reached);
    `routers` are those of them in the group hicache_routers (judged by the routers' play)."""
    import ansible_runner

    from hicachectl.config import inventory as inventories

    # The vault secrets of the in-process loader, for ansible-playbook too: its arguments, the answers to its
    # password prompts (a typed password stays in memory), the environment with absolute paths.
    vault_args, vault_answers, vault_env = inventories.vault_for_runner()
    cmdline = list(vault_args)
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    collector = _Collector(progress, routers)
    for name in hosts:
        collector.host(name)
    with tempfile.TemporaryDirectory(prefix="hicachectl-") as private, _cancel_on_signals() as cancelled:
        skips = pathlib.Path(private) / "skips.jsonl"
        result = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(PLAYBOOKS),
            playbook=str(PLAYBOOKS / playbook),
            inventory=str(inventory),
            limit=limit,
            tags=tags,
            extravars=extravars or {},
            cmdline=" ".join(map(shlex.quote, cmdline)) or None,
            passwords=vault_answers or None,
            # ansible-runner starts from this process's environment; these are ours: the user's Ansible settings with
            # what hicachectl needs on top (ansible_settings). The Ansible installed beside this Python runs, even
            # when its venv is not activated.
            envvars={**ansible_settings(), "ANSIBLE_NOCOLOR": "1", "HICACHE_SKIPS_FILE": str(skips),
                     "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]), **vault_env},
            event_handler=collector,
            cancel_callback=cancelled,
            quiet=True,
            suppress_env_files=True,
        )
        for line in skips.read_text().splitlines() if skips.exists() else []:
            skip = json.loads(line)
            collector.host(skip["host"]).skips.append(Record(skip["task"], skip["reason"]))
    rc = result.rc if result.rc is not None else 1
    interrupted = None
    if not collector.finished:
        # Without its final stats the run's per-host counts are unknown: no host may read as ok.
        interrupted = ("stopped by a signal to hicachectl" if cancelled() else
                       f"the playbook ended ({result.status}, exit {rc}) before its final report")
        for host in collector.hosts.values():
            host.interrupted = True
    return RunResult(rc=rc if interrupted is None else (rc or 1), hosts=collector.hosts, interrupted=interrupted)
