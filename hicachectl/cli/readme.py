"""The README's exit-code table, generated from hicachectl.cli.main.EXIT_CODES (`python -m hicachectl.cli.readme --write`;
without --write it exits 1 when the README has drifted, as `python -m hicachectl.config.schema` does)."""

from __future__ import annotations

import sys

from hicachectl.config import paths

# A checkout-only tool: an installed package carries no README (main() says so).
README = paths.CHECKOUT / "README.md" if paths.CHECKOUT is not None else None
START, END = "<!-- exit-codes:start -->", "<!-- exit-codes:end -->"


def exit_codes_table() -> str:
    from hicachectl.cli.main import CHECK_COMMANDS, CHECK_EXIT_CODES, EXIT_CODES, PLAN_EXIT_CODES

    checks = ", ".join(f"`{c}`" for c in CHECK_COMMANDS)
    rows = [f"| exit | every command | {checks} | `plan --detailed-exitcode` |", "|---|---|---|---|"]
    rows += [f"| `{code}` | {EXIT_CODES[code]} | {CHECK_EXIT_CODES[code]} | {PLAN_EXIT_CODES[code]} |" for code in sorted(EXIT_CODES)]
    return "\n".join(rows)


def wanted(text: str) -> str:
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{START}\n{exit_codes_table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    paths.checkout()
    text = README.read_text()
    new = wanted(text)
    if new == text:
        return 0
    if "--write" in argv:
        README.write_text(new)
        print(f"wrote {README}")
        return 0
    print(f"stale {README}: run python -m hicachectl.cli.readme --write")
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
