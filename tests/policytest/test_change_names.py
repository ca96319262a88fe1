"""Every change the mutating webhook can make is named in policies/tests/README.md's table,
and every name there is one the code makes: the names a policy test's ``changes`` lists
(and the ``gpu-webhook.dev/mutated`` annotation, and the mutations metric) are written in
one place a platform engineer can read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where a change is named: appended to a step's changes, or added to a decision's.
MADE = re.compile(r'changes\.append\("([a-z-]+)"\)|mutations=\[\*d\.mutations, ([^\]]+)\]'
                  r'|decide\(patch\.ops, \["([a-z-]+)"\]')


def made() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "webhook").rglob("*.py"):
        for m in MADE.finditer(path.read_text()):
            if m[2]:
                names.update(re.findall(r'"([a-z-]+)"', m[2]))
            else:
                names.add(m[1] or m[3])
    return names


def documented() -> set[str]:
    text = (ROOT / "policies" / "tests" / "README.md").read_text()
    table = text.split("| change |", 1)[1].split("\n\n", 1)[0]
    return {n for row in table.splitlines()[2:] for n in re.findall(r"`([a-z-]+)`",
                                                                       row.split("|")[1])}


def test_every_change_the_webhook_makes_is_in_the_table_and_nothing_else() -> None:
    code = made()
    assert {"gpu-requests", "requested-by", "waiting", "borrowed"} <= code  # the scan works
    assert code == documented()
