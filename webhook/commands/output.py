"""How commands print structured results (``-o json``, ``-o yaml``)."""

from __future__ import annotations

from typing import Any

import orjson
import yaml


def dump(data: Any, output: str) -> str:
    """``data`` as ``-o json`` or ``-o yaml`` prints it."""
    if output == "yaml":
        return yaml.safe_dump(data, sort_keys=False, width=100).rstrip("\n")
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
