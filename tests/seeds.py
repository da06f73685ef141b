"""The commands of the four seed documents, as real bash runs them.

Each seed's shell text (non-breaking spaces turned into spaces, as a careful reader would) runs in
bash with `python`, `python3`, `docker`, `mkdir` and `chmod` replaced by recorders on PATH: the
recorders write the argv and the environment they received, and do nothing else.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

SEED_FILES = {"vast": "000_43d8dd1cc9868860.txt", "adp": "002_83cfa4af1556718b.txt",
              "local": "003_bf19387ddce636f0.txt", "netapp": "004_13eb9070e6654618.txt"}

_RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": dict(os.environ)}}) + "\\n")
"""


def seed_text(shared: pathlib.Path, name: str) -> str:
    return (shared / "seeds" / SEED_FILES[name]).read_text().replace("\u00a0", " ")


def run_recorded(script: str, env: dict[str, str] | None = None) -> list[dict]:
    """Run shell text in real bash with the recorders first on PATH; return what they recorded."""
    with tempfile.TemporaryDirectory() as tmp:
        bindir = pathlib.Path(tmp, "bin")
        bindir.mkdir()
        for prog in ("python", "python3", "docker", "podman", "mkdir", "chmod"):
            (bindir / prog).write_text(_RECORDER)
            (bindir / prog).chmod(0o755)
        record = pathlib.Path(tmp, "record.jsonl")
        record.touch()
        base = {"PATH": f"{bindir}:{os.environ['PATH']}", "RECORD": str(record), "HOME": tmp}
        proc = subprocess.run(["bash", "-c", script], env={**base, **(env or {})}, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"bash failed: {proc.stderr}"
        return [json.loads(line) for line in record.read_text().splitlines()]


def launched(records: list[dict]) -> dict:
    """The one SGLang launch among the records: its server argv (after -m sglang.launch_server) and env."""
    launches = [r for r in records if r["prog"] in ("python", "python3")]
    assert len(launches) == 1, launches
    argv = launches[0]["argv"]
    assert argv[:2] == ["-m", "sglang.launch_server"], argv
    return {"argv": argv[2:], "env": launches[0]["env"]}


def _code_block_after(text: str, heading: str) -> str:
    start = text.index(heading)
    body = text[text.index("```bash\n", start) + len("```bash\n"):]
    return body[:body.index("```")]


def vast_start_sh(shared) -> str:
    return _code_block_after(seed_text(shared, "vast"), "### `./cfg/start.sh`")


def vast_run_sh(shared) -> str:
    return _code_block_after(seed_text(shared, "vast"), "### `./run.sh`")


def netapp_command(shared) -> str:
    text = seed_text(shared, "netapp")
    start = text.index("PYTHONHASHSEED=0")
    return text[start:text.index("Performance comparison", start)]


def netapp_toml(shared) -> str:
    text = seed_text(shared, "netapp")
    start = text.index("NIXL backend config file\n") + len("NIXL backend config file\n")
    return text[start:text.index("SGLang server startup command\n")].strip() + "\n"


def adp_command(shared, model_path: str) -> str:
    """The seed writes `<model>` for the model path; the inventory names it."""
    text = seed_text(shared, "adp")
    start = text.index("python -m sglang.launch_server --model-path <model>")
    end = text.index("}'", start) + 2
    return text[start:end].replace("<model>", shlex.quote(model_path))


def local_file_tier(shared) -> str:
    """The tutorial's file-tier step: the export and the launch (the page lost the newline after it)."""
    text = seed_text(shared, "local")
    export = re.search(r"^export SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR=\S+$", text, re.M).group(0)
    launch = re.search(r"^python -m sglang\.launch_server .*?--hicache-storage-backend file", text, re.M).group(0)
    return export + "\n" + launch + "\n"


def flag_pairs(argv: list[str], aliases: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """argv -> sorted (flag, value) pairs; a flag followed by another flag (or nothing) has no value."""
    pairs, i = [], 0
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), f"unexpected positional {flag!r} in {argv}"
        if "=" in flag:
            flag, value = flag.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
            i += 2
        else:
            value = None
            i += 1
        pairs.append(((aliases or {}).get(flag, flag), value))
    return sorted(pairs, key=lambda p: (p[0], p[1] or ""))
