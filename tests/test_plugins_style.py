"""What ansible-test sanity (tests/test_collection.py, slow) refuses in the collection's plugins, caught in the fast
tier: its pep8 test runs pycodestyle with --max-line-length 160 (ansible_test/_internal/commands/sanity/pep8.py),
where the project's ruff allows 220."""

from __future__ import annotations

from support import ROOT


def test_plugin_lines_fit_ansible_tests_pep8_limit():
    long = [f"{path.relative_to(ROOT)}:{n}: {len(line)}" for path in sorted((ROOT / "plugins").rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 160]
    assert not long, long


def test_every_plugins_documentation_is_yaml():
    """ansible-doc and validate-modules read DOCUMENTATION, EXAMPLES and RETURN as YAML; a plain scalar holding ': '
    broke hicache_router_worker's once, seen only by the slow tier. Read here from the source, as ansible-doc does
    (the string constants, without running the plugin)."""
    import ast

    import yaml

    broken = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                        try:
                            yaml.safe_load(node.value.value)
                        except yaml.YAMLError as exc:
                            broken.append(f"{path.relative_to(ROOT)} {target.id}: {str(exc).splitlines()[0]}")
    assert not broken, broken
