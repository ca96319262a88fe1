"""README.md's Layout section names every module of ``webhook/`` in the room it is in, so
the map a newcomer reads cannot drift from the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rooms() -> dict[str, str]:
    """Each room of the Layout block (``server/``, ``server/web/``, ...) -> its text."""
    text = (ROOT / "README.md").read_text()
    layout = text.split("\n## Layout\n", 1)[1].split("```\n", 1)[1].split("\n```", 1)[0]
    out: dict[str, str] = {}
    parent, room = "", ""
    for line in layout.splitlines()[1:]:  # after "webhook/"
        m = re.match(r"^( {2}| {4})(\S+)\s", line + " ")
        if m and (m.group(2).endswith("/") or m.group(2).endswith(".py")):
            name = m.group(2)
            if len(m.group(1)) == 2:
                parent = name if name.endswith("/") else ""
                room = name
            else:
                room = parent + name
            out.setdefault(room, "")
            line = line[len(m.group(0)):]
        out[room] = out.get(room, "") + " " + line
    return out


def test_every_module_is_named_in_its_room() -> None:
    found = rooms()
    missing = []
    for path in sorted((ROOT / "webhook").rglob("*.py")):
        rel = path.relative_to(ROOT / "webhook")
        if path.name == "__init__.py" or rel.parts[0] == "defaults":
            continue
        if len(rel.parts) == 1:
            if rel.name not in found:
                missing.append(str(rel))
            continue
        room = "/".join(rel.parts[:-1]) + "/"
        stem = path.stem
        if room not in found or not re.search(rf"\b{re.escape(stem)}\b", found[room]):
            # A package room (libs/kube/) may be told of inside its parent's text.
            parent = rel.parts[0] + "/"
            if not (len(rel.parts) > 2 and re.search(rf"\b{re.escape(stem)}\b",
                                                     found.get(parent, ""))):
                missing.append(str(rel))
    assert not missing, f"README.md's Layout does not name: {', '.join(missing)}"


def test_every_room_it_names_exists() -> None:
    for room in rooms():
        assert (ROOT / "webhook" / room).exists(), f"README.md's Layout names {room}"
