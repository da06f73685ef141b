"""hicachectl: deploy SGLang HiCache servers. Each command validates, calls the hicachectl modules, reports.

This module is the app: its global options, the last-resort error handler, the exit codes (EXIT_CODES below;
the README's table is generated from it) and the commands, registered from their families:
offline.py (validate, render, init, size, monitoring: no host touched), change.py (deploy, upgrade,
rollback, restart), observe.py (plan, doctor, status, verify), bench.py (bench), l3.py (l3).
What they share (options, the inventory guard, the report of a run) is common.py. Heavy imports (Ansible,
Jinja) happen inside the commands so `--help` stays instant.
"""

from __future__ import annotations

import pathlib
import sys
import warnings

import typer

from hicachectl.cli import bench as cli_bench
from hicachectl.cli import change as cli_change
from hicachectl.cli import l3 as cli_l3
from hicachectl.cli import observe as cli_observe
from hicachectl.cli import offline as cli_offline
from hicachectl.cli.common import EXIT_INVALID, EXIT_OK, EXIT_USAGE, say

# Ansible's SSH agent support imports DSA from cryptography, which warns on every command that reads an inventory
# (ansible/_internal/_ssh/_ssh_agent.py): a library's deprecation, nothing an operator can act on.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"ansible\._internal\._ssh\._ssh_agent")

# The one table of exit codes: `python -m hicachectl.cli.readme --write` puts it in the README.
EXIT_CODES = {
    EXIT_OK: "ok: valid, rendered, deployed, measured",
    EXIT_INVALID: "invalid inventory (a finding, a YAML error, an encrypted value without its password) or model config, a host that failed, "
                  "was unreachable, interrupted or never reached, a server bench could not reach, or an unexpected error "
                  "(one line; the details in a file it names)",
    EXIT_USAGE: "usage: an unknown command or option, a bad option value (`size --tp 0`, `bench --concurrency 0`, a vault "
                "password file that does not exist), an unknown inventory, `render --out` onto existing files without `--force`",
}
# doctor, verify and status follow DeepOps: 2 also means a host could not be checked.
CHECK_EXIT_CODES = {
    EXIT_OK: "nothing required is missing; every check passed (`not checked` only where `hicache_strict: false` tolerates it)",
    EXIT_INVALID: "a required item is missing, a check failed, a server is not healthy or not running the inventory's config",
    EXIT_USAGE: "a host could not be checked (or a usage error, as for every command)",
}
CHECK_COMMANDS = ("doctor", "verify", "status")
# plan --detailed-exitcode, as Terraform's plan -detailed-exitcode, for CI to gate on (hicachectl.cli.common.plan_exit_code).
PLAN_EXIT_CODES = {
    EXIT_OK: "nothing to change on any host",
    EXIT_INVALID: "an error (as for every command), or a change `deploy` would refuse (a downgrade without `--allow-downgrade`)",
    EXIT_USAGE: "changes pending (never an error: with this option an unreadable inventory or vault file exits 1)",
}


def _flags_without_type() -> None:
    """--help names the value an option takes; a flag takes none. typer 0.29's rich help prints the Python type of
    every option (typer/core.py TyperOption.display_type_rich), so each flag read `--json <bool>`: a flag shows no type."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_hicache_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    display_type_rich._hicache_flags = True
    TyperOption.display_type_rich = display_type_rich


_flags_without_type()


class _App(typer.Typer):
    """The typer app, with one handler for what no command expected: one line, the details in a file."""

    def __call__(self, *args, **kwargs):
        # What the inventory gave as `!vault` is masked in everything the command prints, whichever variable holds
        # it (the catalogue's secrets are masked where they are printed, as before).
        sys.stdout, sys.stderr = _VaultMasked(sys.stdout), _VaultMasked(sys.stderr)
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the last resort: never a traceback unless asked for
            raise SystemExit(_unexpected(exc)) from None
        finally:
            sys.stdout, sys.stderr = sys.stdout.inner, sys.stderr.inner


class _VaultMasked:
    """A text stream that writes through, the texts of the inventory's vaulted values masked (config/secrets.py)."""

    def __init__(self, inner):
        self.inner = inner.inner if isinstance(inner, _VaultMasked) else inner

    def write(self, text):
        from hicachectl.config import secrets

        return self.inner.write(secrets.mask_text(text, secrets._VAULTED) if secrets._VAULTED and isinstance(text, str) else text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


app = _App(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0], pretty_exceptions_enable=False)
_DEBUG = "--debug" in sys.argv[1:2]


def _unexpected(exc: BaseException) -> int:
    """One line for an unexpected error; the traceback goes to a file (0600) and, with --debug, to stderr."""
    import datetime
    import os
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(exc))
    if _DEBUG:
        sys.stderr.write(text)
    where = None
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    home = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    for folder in (pathlib.Path(os.environ["HICACHE_CACHE"]) if os.environ.get("HICACHE_CACHE") else home / "hicache-deploy",
                   pathlib.Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"hicachectl-error-{stamp}-", suffix=".txt", dir=folder)
            with os.fdopen(fd, "w") as handle:
                handle.write(f"hicachectl {_version()}: {' '.join(sys.argv[1:])}\n\n{text}")
            where = name
            break
        except OSError:
            continue
    message = " ".join(str(exc).split()) or "(no message)"
    say(f"error: unexpected {type(exc).__name__}: {message[:300]}"
         + (f" (details in {where}" + ("" if _DEBUG else "; --debug shows them here") + ")" if where else ""))
    return EXIT_INVALID


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("hicache-deploy")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"hicachectl {_version()}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help="Show the traceback of an unexpected error (it is always written to a file).")) -> None:
    """Deploy SGLang HiCache servers: validate, render, plan, deploy, verify, bench."""
    global _DEBUG
    _DEBUG = _DEBUG or debug


# --help lists the commands in this order, the order an operator meets them in (so the families interleave).
COMMANDS = (cli_offline.validate, cli_offline.render, cli_offline.init, cli_offline.size, cli_observe.plan, cli_observe.doctor,
            cli_change.deploy, cli_observe.status, cli_observe.verify, cli_bench.bench, cli_change.upgrade, cli_change.restart,
            cli_change.rollback, cli_offline.monitoring, cli_l3.l3)
for _command in COMMANDS:
    # The list of commands shows each one's first paragraph as one flowing line: the docstring's own line breaks
    # (kept by rich's help) cut it mid-sentence.
    app.command(short_help=" ".join((_command.__doc__ or "").split("\n\n")[0].split()))(_command)
