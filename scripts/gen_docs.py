"""Regenerate the generated parts of the docs from the drivers' declared guarantees.

    python scripts/gen_docs.py           # rewrite docs/choosing.md's table in place
    python scripts/gen_docs.py --check   # exit 1 if the committed table is out of date (the test suite runs this)

The table sits between the markers ``<!-- guarantees:begin -->`` and ``<!-- guarantees:end -->``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lockkit.registry import load_factory

DOC = Path(__file__).resolve().parent.parent / "docs" / "choosing.md"
BEGIN, END = "<!-- guarantees:begin -->", "<!-- guarantees:end -->"
SCHEMES = [
    "memory", "file", "redis", "redis+sentinel", "redis+cluster", "redlock", "zookeeper", "etcd", "postgresql"
]
SCOPE = {
    "process": "one process",
    "host": "one host",
    "single-node": "one server",
    "majority": "majority of independent masters",
    "consensus": "consensus (quorum of replicas)",
}


def table() -> str:
    rows = [
        "| scheme | who agrees on the holder | FIFO waiters | fencing tokens | survives a server failure | "
        "a lock lives until |",
        "|---|---|---|---|---|---|",
    ]
    for scheme in SCHEMES:
        g = load_factory(scheme).guarantees
        life = "its TTL passes unrenewed" if g.lifetime == "ttl" else "the client's session/lease ends"
        rows.append(
            f"| `{scheme}://` | {SCOPE[g.scope]} | {'yes' if g.fifo else 'no'} | {g.fencing} | "
            f"{'yes' if g.survives_failover else 'no'} | {life} |"
        )
    return "\n".join(rows)


def render(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    current = DOC.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print(f"{DOC} is out of date: run python scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
