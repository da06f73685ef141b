"""The README and docs/: short README, every link resolving, no internal words in user text, --help without type
noise on flags, and the facts a newcomer needs said plainly (issue 24, item 9)."""

from __future__ import annotations

import ast
import re

import pytest
from support import ROOT, cli

DOCS = [ROOT / "README.md", ROOT / "COLLECTION.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
# internal words, not for users: the team's name for the source documents, and for the Python package
_INTERNAL = re.compile(r"(?<![/\w])seeds?(?![\w.])|\bthe core\b", re.IGNORECASE)
# notes of a test machine, not for users either (#34): a dated run of the commands ("were run as written on
# 2026-12-04", "measured on ..."), this machine's size ("on this 2-core"), the kind of VM it is, and the addresses its
# QEMU user network (10.0.2.x) and Podman's default network (10.88.x.x) gave. Not "this machine" alone: the README's
# "on this machine" is the reader's.
# Words may wrap onto the next line: the pattern is searched in the whole text.
_MACHINE_NOTES = re.compile(r"\b(?:run|ran|measured|tested|tried|seen)\b(?:\s+as\s+written)?,?\s+on\s+20\d\d-\d\d-\d\d"
                            r"|\bthis\s+\d+-(?:core|cpu|vcpu)\b|\bthis\s+(?:machine|vm)\s+kind\b"
                            r"|(?<![\d.])10\.(?:0\.2|88\.\d{1,3})\.\d{1,3}(?!\.?\d)", re.IGNORECASE)
# The test bed's own records, where the machine a result came from is the subject: the dated measurements and the
# pages that describe the suite's containers and VMs.
TEST_BED_RECORDS = {"measurements.md", "testing.md", "testing-vms.md", "docker-vm.md"}


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, re.MULTILINE)}


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves(doc):
    broken = []
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
    for match in _LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # a URL: not checked offline
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            broken.append(f"{target}: no {where}")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {where.name}")
    assert not broken, broken


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[there](there.md) [gone](gone.md) [a](#missing)\n\n# Here\n")
    (tmp_path / "there.md").write_text("# There\n")
    found = [m.group(1) for m in _LINK.finditer(page.read_text())]
    assert found == ["there.md", "gone.md", "#missing"]
    assert not (tmp_path / "gone.md").exists() and "missing" not in _anchors(page) and "here" in _anchors(page)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_internal_words_in_user_text(doc):
    text = doc.read_text()
    found = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if _INTERNAL.search(line)]
    if doc.parent.name == "docs" and doc.name not in TEST_BED_RECORDS:
        found += [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split())) for m in _MACHINE_NOTES.finditer(text)]
    assert not found, found


def test_the_machine_notes_pattern_sees_a_note_and_leaves_plain_text():
    notes = ["These commands were run as written\non 2026-12-04 (deploy: degraded)", "Measured on 2026-12-01 on a VM",
             "time on this 2-core machine", "this machine kind is itself a VM", "hicache_worker_url: http://10.88.1.1:30000",
             "the guest at 10.0.2.15.", "Podman gave it 10.88.0.7"]
    plain = ["plan the built-in `local` inventory on this machine", "it is reproduced as written", "10.20.0.1",
             "`192.0.2.x`", "a run on every host", "110.0.2.5", "10.0.2.150.1", "10.88.1", "measured on eight hosts (2026-11-30)"]
    assert [n for n in notes if not _MACHINE_NOTES.search(n)] == []
    assert [p for p in plain if _MACHINE_NOTES.search(p)] == []


def test_no_internal_words_in_validates_messages():
    """Every string of the rules but their docstrings is a message, a fix or a part of one that validate prints."""
    found = []
    for path in sorted((ROOT / "hicachectl/rules").glob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        found += [(path.name, node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings and _INTERNAL.search(node.value)]
    assert not found, found


def test_no_internal_words_in_the_profiles_comments():
    found = [(p.relative_to(ROOT).as_posix(), line.strip()) for p in sorted((ROOT / "inventories").rglob("*.yml"))
             for line in p.read_text().splitlines() if line.lstrip().startswith("#") and _INTERNAL.search(line)]
    assert not found, found


def test_variables_md_says_hicache_serial_is_1_for_upgrade_and_restart():
    """#34: the variable table (generated from the schema) says what hicachectl passes the play: 0 by default, and 1 in
    its place for the commands that roll (upgrade, restart, rollback), as change.play_vars does."""
    from helpers import deployment

    from hicachectl.cli.change import play_vars

    [row] = [line for line in (ROOT / "docs/variables.md").read_text().splitlines() if line.startswith("| `hicache_serial` |")]
    assert "| int | `0` |" in row and "upgrade, restart and rollback take 1 when it is 0" in row, row
    unset, three = {"gpu-1": deployment("local", serial=0)}, {"gpu-1": deployment("local", serial=3)}
    assert play_vars(unset, rolling=True)["hicache_serial"] == 1 and play_vars(unset, rolling=False)["hicache_serial"] == 0
    assert play_vars(three, rolling=True)["hicache_serial"] == 3


def test_the_readme_says_what_hicache_serial_does_for_each_command():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "`hicache_serial` is the number of hosts changed at once. Unset (0), `deploy` changes every server at once, " \
           "and `upgrade` and `restart` go one host at a time (1)" in text


COMMANDS = ["validate", "render", "init", "size", "plan", "doctor", "deploy", "status", "verify", "bench", "upgrade",
            "restart", "rollback", "monitoring", "l3"]


def test_help_shows_no_type_on_flags():
    for command in [None, *COMMANDS]:
        text = cli(*([command] if command else []), "--help", env={"COLUMNS": "200"}, check_rc=0).stdout
        assert "<bool>" not in text, command
        words = _INTERNAL.search(" ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split()))
        assert not words, (command, words and words.group(0))
    assert "<str>" in cli("render", "--help", env={"COLUMNS": "200"}, check_rc=0).stdout  # an option with a value keeps its type
