"""``python -m bench.report RESULTS.json``: the Markdown block docs/PERFORMANCE.md records.

Prints the machine, date, command, revision measured and the results table of one run,
so the document is pasted from the JSON rather than retyped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .common import Row, table


def rows_of(data: dict[str, Any]) -> list[Row]:
    fields = set(Row.__dataclass_fields__)
    return [Row(**{k: v for k, v in row.items() if k in fields}) for row in data["rows"]]


def render(data: dict[str, Any]) -> str:
    machine = data["machine"]
    revision = machine.get("revision", {})
    dirty = revision.get("uncommitted_project_files") or []
    packages = ", ".join(f"{k} {v}" for k, v in machine.get("packages", {}).items())
    info = data.get("info", {})
    logs = ", ".join(
        f"{int(size):,} events ({log['turns']:,} turns, built in {log['seconds']} s)"
        for size, log in info.get("logs", {}).items()
    )
    rows = rows_of(data)
    met = sum(r.met is True for r in rows)
    missed = sum(r.met is False for r in rows)
    lines = [
        f"- **Date:** {machine['date']}",
        f"- **Command:** `{data['command']}` ({info.get('seconds', '?')} s wall)",
        f"- **Machine:** {machine['cpu']}, {machine['cores']} cores, "
        f"{machine['memory_mib']:,} MiB RAM; {machine['os']}; load average at start "
        f"{machine['load_average_at_start']}",
        f"- **Software:** Python {machine['python']}, SQLite {machine['sqlite']}, {packages}",
        f"- **Revision:** {revision.get('commit', '?')}"
        + (f" plus uncommitted work in {', '.join(dirty)}" if dirty else ""),
        f"- **Corpus:** {info.get('corpus', '?')}; big logs: {logs or '-'}",
        f"- **Targets:** {met} met, {missed} missed",
        "",
        table(rows),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.report RESULTS.json", file=sys.stderr)
        return 2
    print(render(json.loads(Path(args[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
