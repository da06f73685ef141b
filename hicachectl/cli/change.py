"""The commands that change hosts: deploy, upgrade, rollback, restart. Each is one playbook run (`run_and_report`,
which `plan` uses too, in check mode): the inventory guarded, the run named in the hosts' deploy locks, the locks
a cut-short run left released, the run reported (hicachectl.cli.common.report_run)."""

from __future__ import annotations

from typing import NoReturn

import typer

from hicachectl.cli import common

CheckOpt = typer.Option(False, "--check", help="Dry run.")
# What a command says after its own refusals (upgrade --image): nothing was run.
REFUSED = "refused: no host was contacted."
AllowDowngradeOpt = typer.Option(False, "--allow-downgrade", help="Go on where the inventory pins an older SGLang than a "
                                 "server runs (refused without it; `plan` names each downgrade).")


def names_ansible_config(command):
    """Ends a command's --help with the Ansible configuration its playbook runs with, found as Ansible finds it from
    this directory (hicachectl.config.paths.ansible_config: pure file checks, so --help stays instant)."""
    from hicachectl.config import paths

    command.__doc__ = (f"{command.__doc__}\n\nAnsible settings: {paths.ansible_config().describe()}; hicachectl adds its "
                       "callbacks and its collection to that file's callbacks and collections path.")
    return command


def _verb(check: bool) -> str:
    return "would change" if check else "changed"


@names_ansible_config
@common.with_vault
def deploy(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt,
           check: bool = typer.Option(False, "--check", help="Dry run, as `plan`."),
           diff: bool = typer.Option(False, "--diff/--no-diff", help="Show the content of each change."),
           allow_downgrade: bool = AllowDowngradeOpt) -> None:
    """Validate, then bring every host to the inventory's state. A failed host does not stop the others. A host whose server runs a newer SGLang than the inventory pins is refused unless --allow-downgrade."""
    run_and_report("site.yml", inventory, limit, json, check=check, show_diff=diff or check, verb=_verb(check),
                   extravars=_downgrade_vars(allow_downgrade))


@names_ansible_config
@common.with_vault
def upgrade(image: str | None = typer.Option(None, "--image", help="The image you expect to roll out: refused unless it is the "
                                                                     "inventory's hicache_image on every host (the image lives in the inventory)."),
            inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt,
            check: bool = CheckOpt, allow_downgrade: bool = AllowDowngradeOpt) -> None:
    """Roll the inventory's image out in batches (hicache_serial, default 1 host); a batch that does not become healthy is rolled back to its previous config and image, and the rollout stops there.

    The image lives in the inventory (hicache_image), as every other setting: set the new one there, then upgrade. The fleet never ends unlike its inventory: `status` and the next `deploy` agree with it."""
    run_and_report("site.yml", inventory, limit, json, check=check, show_diff=check, verb=_verb(check),
                   extravars=_downgrade_vars(allow_downgrade), rolling=True,
                   refusals=(lambda deployments: image_refusals(deployments, image)) if image is not None else None)


def image_refusals(deployments: dict, image: str) -> list:
    """A finding for each host whose inventory pins another image than `image` (upgrade --image): rolling out an image
    the inventory does not name would leave the fleet unlike it, and the next deploy would roll it back silently."""
    from hicachectl.ops import rolling
    from hicachectl.rules.findings import ERROR, Finding

    return [Finding(ERROR, host, "hicache_image", "upgrade-image",
                    f"upgrade --image {image} is not the image the inventory pins ({d.image}); upgrade rolls out the inventory's image.",
                    f"set hicache_image: {image} in the inventory (e.g. group_vars/all.yml), then run `hicachectl upgrade` again.")
            for host, d in sorted(deployments.items()) if d is not None and not rolling.same_image(image, d.image)]


def _downgrade_vars(allow_downgrade: bool) -> dict:
    """What tells the roles that a downgrade is asked for (roles/sglang_image/tasks/downgrade.yml)."""
    return {"__hicache_allow_downgrade": True} if allow_downgrade else {}


@names_ansible_config
@common.with_vault
def restart(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt,
            check: bool = CheckOpt) -> None:
    """Restart the servers in batches (hicache_serial, default 1 host), each waited for on /health."""
    run_and_report("restart.yml", inventory, limit, json, check=check, show_diff=False, verb=_verb(check), rolling=True)


@names_ansible_config
@common.with_vault
def rollback(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt,
             check: bool = CheckOpt) -> None:
    """Put each host's previous config (and image) back, restart, and wait for /health."""
    run_and_report("rollback.yml", inventory, limit, json, check=check, show_diff=check, verb=_verb(check), rolling=True)


def play_vars(deployments: dict, rolling: bool, extravars: dict | None = None) -> dict:
    """Batch size and failure tolerance for the play (play keywords cannot read inventory variables)."""
    extravars = dict(extravars or {})
    if deployments and all(d is not None for d in deployments.values()):
        first = next(iter(deployments.values()))
        extravars.setdefault("hicache_serial", 1 if rolling and not first.serial else first.serial)
        extravars.setdefault("hicache_max_fail_percentage", 0 if rolling else first.max_fail_percentage)
    return extravars


def new_run_id() -> str:
    """Names the run in the hosts' locks; chosen here so the CLI can release them after an interrupted run."""
    import datetime
    import secrets

    return f"{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"


# The task a note of the lock release is filed under: hicachectl's own step after the run (unlock.yml).
RELEASE_TASK = "release the deploy lock"
# The task that takes a host's deploy lock, by this name in every playbook that takes it (site.yml, restart.yml,
# rollback.yml, verify.yml; tests/test_operator_output.py holds them to it): a host it never ran for holds no lock.
LOCK_TASK = "Take the deploy lock of this host"


class LockWatch:
    """A run's progress (passed on to `show`) that also notes the hosts whose deploy lock this run took (LOCK_TASK
    ended ok for them): the only hosts a finished run can have left locked."""

    def __init__(self, show):
        self.show = show
        self.locked: set[str] = set()

    def __call__(self, host: str, task: str, status: str) -> None:
        if task == LOCK_TASK and status in ("ok", "changed"):
            self.locked.add(host)
        self.show(host, task, status)


def touched(outcome) -> bool:
    """Whether any task of a run ran for the host: its final counts (the whole run's, from Ansible's stats), a failure,
    a change or an event of the last play. A host no task reached cannot hold this run's lock (a task takes it)."""
    return bool(outcome.reached or outcome.unreachable or outcome.ok or outcome.changed or outcome.failed or outcome.skipped
                or outcome.failures or outcome.changes)


def release_locks_after(result, inv, run_id: str, *, check: bool = False, locked: set[str] | None = None) -> None:
    """A run cut short, or a host that failed or was never deployed (a stopped rollout: an earlier play took its
    lock), may keep this run's lock: release them (only this run's), or name them (a note on the host).

    Of a finished run, only the hosts it took the lock of (`locked`, from LockWatch; without it, the hosts a task
    ran for) can hold it: a host the run never reached gets neither a release nor a note (its reason says it was not
    run). A run cut short has no final report, so every host of it is released. Check mode writes no lock (the
    hicache_lock module: "In check mode nothing is written"): nothing to release."""
    from hicachectl.cli import runner

    if check:
        return
    if result.interrupted:
        held = sorted(result.hosts)
    else:
        held = sorted(h for h, r in result.hosts.items() if not r.good and (h in locked if locked is not None else touched(r)))
    if not held:
        return
    released = runner.run_playbook("unlock.yml", inv.path, limit=",".join(held), hosts=held, extravars={"__hicache_run_id": run_id})
    for host in held:
        outcome = released.hosts[host]
        if outcome.good:
            text = f"released the deploy lock of run {run_id} (if it held one)"
        else:
            text = (f"the deploy lock of run {run_id} may still be held on this host (/run/hicache-deploy.lock): could not "
                    f"release it: {common.why_failed(outcome)}. Remove that file once no run uses the host.")
        result.hosts[host].notes.append(runner.Note(RELEASE_TASK, text))


def run_and_report(playbook: str, inventory: str, limit: str | None, json: bool, *, check: bool, show_diff: bool, verb: str,
                   extravars: dict | None = None, rolling: bool = False, refusals=None, detailed_exitcode: bool = False) -> NoReturn:
    """Guard the inventory, run `playbook` on its hosts (its routers too for site.yml), release what a cut-short
    run left locked, report. `refusals(deployments)`: the command's own findings, refused as the inventory's are."""
    from hicachectl.cli import runner
    from hicachectl.config import paths, secrets

    inv, deployments = common.guard(inventory, limit, common.NOTHING_CONTACTED, extravars)
    if refusals is not None:
        common.refuse_invalid(inv, refusals(deployments), REFUSED)
    # diffs (an old start.sh's), notes and reasons show them as ********; a router's too (its index URL)
    hidden = secrets.all_values([*deployments.values(), *getattr(inv, "routers", {}).values()])
    # site.yml ends with the routers' play; the other playbooks run on servers only
    routers = list(inv.routers) if playbook == "site.yml" else []
    common.say(f"{'checking' if check else 'running'} {playbook} on {common.counted(deployments, routers)} of {inv.name}")
    common.say(f"  Ansible settings: {paths.ansible_config().describe()}")
    run_id = new_run_id()
    # With routers a change rolls one server at a time by default (hicache_serial 0 would take every server out of
    # the routers at once): the others serve meanwhile.
    extravars = play_vars(deployments, rolling or bool(getattr(inv, "routers", {})), {**(extravars or {}), "__hicache_run_id": run_id})
    # each change said once: live here, or in the report with its content (plan, --check, --diff)
    watch = LockWatch(common.Progress(changes=not common.lists_changes(check, show_diff)))
    result = runner.run_playbook(playbook, inv.path, limit=limit, check=check, diff=show_diff or check, progress=watch,
                                 extravars=extravars, hosts=[*deployments, *routers], routers=routers)
    release_locks_after(result, inv, run_id, check=check, locked=watch.locked)
    common.report_run(inv, result, json=json, check=check, verb=verb, show_diff=show_diff, hidden=hidden,
                      exit_code=common.plan_exit_code(result) if detailed_exitcode else None)
