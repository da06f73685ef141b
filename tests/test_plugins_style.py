"""What ansible-test sanity (tests/test_collection.py, slow) refuses in the collection's plugins, caught in the fast
tier: its pep8 test runs pycodestyle with --max-line-length 160 (ansible_test/_internal/commands/sanity/pep8.py),
where the project's ruff allows 220."""

from __future__ import annotations

from support import ROOT


def test_plugin_lines_fit_ansible_tests_pep8_limit():
    long = [f"{path.relative_to(ROOT)}:{n}: {len(line)}" for path in sorted((ROOT / "plugins").rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 160]
    assert not long, long
