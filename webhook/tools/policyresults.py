"""Policy test results (``gpu-webhook test``): what the webhook did with a case's
object, compared with what the suite expects (each difference said in a line that shows
what to fix), and the results rendered as a table or as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.k8s.objects import escape, parse_pointer
from webhook.tools.policysuite import Case, Expect

# ``allowed`` in a suite means "admitted": it also matches a pod admitted with audit-only
# findings or one no rule applied to. ``audited`` and ``skipped`` match only themselves.
_ADMITTED = frozenset({"allowed", "audited", "skipped"})


@dataclass
class Got:
    """What the webhook did with one case's object."""

    outcome: str
    phase: str | None = None
    rules: list[str] = field(default_factory=list)
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    patched: dict[str, Any] | None = None
    reserved: bool = False
    tenant: str | None = None


@dataclass
class CaseResult:
    name: str
    expected: str
    got: Got
    differences: list[str]

    @property
    def passed(self) -> bool:
        return not self.differences


@dataclass
class SuiteResult:
    path: str
    name: str
    policy: str
    cases: list[CaseResult] = field(default_factory=list)
    error: str | None = None  # the suite could not run at all

    @property
    def failed(self) -> int:
        return sum(not c.passed for c in self.cases)


_MISSING = object()


def resolve(doc: Any, pointer: str) -> Any:
    """The value at a JSON Pointer, or ``_MISSING``."""
    try:
        tokens = parse_pointer(pointer)
    except ValueError:
        return _MISSING
    node = doc
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _MISSING
    return node


def compare(case: Case, got: Got) -> CaseResult:
    e = case.expect
    diff: list[str] = []
    ok = got.outcome in _ADMITTED if e.outcome == "allowed" else got.outcome == e.outcome
    if not ok:
        why = f": {_first(got.message)}" if got.message else ""
        if got.warnings and e.outcome != "warned":
            why = f": warning {_first(got.warnings[0])}"
        diff.append(f"outcome: expected {e.outcome}, got {got.outcome}{why}")
    if e.phase is not None and got.phase != e.phase:
        diff.append(f"phase: expected the {e.phase} webhook to deny, got "
                    f"{got.phase or 'no denial'}")
    for rule in e.rule:
        if rule.value not in got.rules:
            diff.append(f"rule: expected a {rule.value} finding, got "
                        f"{', '.join(got.rules) or 'no findings'}")
    for text in e.message_contains:
        if text not in got.message:
            diff.append(f"message: expected it to contain {text!r}, got "
                        f"{_quote(got.message) if got.message else 'no message'}")
    for text in e.warning_contains:
        if not any(text in w for w in got.warnings):
            shown = "; ".join(_quote(w) for w in got.warnings) or "no warnings"
            diff.append(f"warnings: expected one containing {text!r}, got {shown}")
    if e.changes is not None and sorted(e.changes) != sorted(got.changes):
        missing = [c for c in e.changes if c not in got.changes]
        extra = [c for c in got.changes if c not in e.changes]
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"unexpected {', '.join(extra)}"] if extra else []
        diff.append(f"changes: expected [{', '.join(e.changes)}], got "
                    f"[{', '.join(got.changes)}] ({'; '.join(parts)})")
    for p in e.patched:
        if got.patched is None:
            diff.append(f"patched {p.path}: no patched object (the request was denied by "
                        f"the {got.phase} webhook)")
            continue
        at = resolve(got.patched, p.path)
        if p.absent:
            if at is not _MISSING:
                diff.append(f"patched {p.path}: expected absent, got {_json(at)}")
        elif at is _MISSING:
            diff.append(f"patched {p.path}: expected {_json(p.value) if 'value' in p.model_fields_set else 'a value'}, "  # noqa: E501
                        f"got nothing there{_nearest(got.patched, p.path)}")
        elif "value" in p.model_fields_set and at != p.value:
            diff.append(f"patched {p.path}: expected {_json(p.value)}, got {_json(at)}")
    return CaseResult(case.name, _expected(e), got, diff)


def _nearest(doc: Any, pointer: str) -> str:
    """Where the pointer stops matching, to make a wrong index or key easy to spot."""
    parts = pointer[1:].split("/")
    for n in range(len(parts) - 1, 0, -1):
        parent = "/" + "/".join(parts[:n])
        node = resolve(doc, parent)
        if node is not _MISSING:
            if isinstance(node, dict):
                keys = ", ".join(escape(k) for k in list(node)[:8])
                return f" ({parent} has keys: {keys})"
            if isinstance(node, list):
                return f" ({parent} has {len(node)} items)"
            return f" ({parent} is {_json(node)})"
    return ""


def _expected(e: Expect) -> str:
    out: str = e.outcome
    if e.rule:
        out += f" [{', '.join(r.value for r in e.rule)}]"
    return out


def _first(text: str) -> str:
    # The whole first line: the end of a message (its fix, its rule) is what tells two
    # denials apart, so it is never cut.
    line = text.splitlines()[0] if text else ""
    return line + (" (+ more lines)" if "\n" in text.strip() else "")


def _quote(text: str) -> str:
    # The whole first line: a substring that is not there is easiest to spot in full.
    line = text.splitlines()[0] if text else ""
    return repr(line) + (" (+ more lines)" if "\n" in text else "")


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


# -- output -----------------------------------------------------------------------------


def got_label(c: CaseResult) -> str:
    out = c.got.outcome
    if c.got.rules and c.got.outcome != "allowed":
        out += f" [{', '.join(c.got.rules)}]"
    return out


def render_text(results: list[SuiteResult]) -> str:
    lines: list[str] = []
    for s in results:
        if s.error is not None:
            lines.append(f"{s.path}: ERROR, the suite cannot run:")
            lines.extend(f"  {line}" for line in s.error.splitlines())
            lines.append("")
            continue
        lines.append(f"{s.path}: {s.name}, {s.policy}")
        width = min(48, max(len(c.name) for c in s.cases) if s.cases else 4)
        exp_w = max([8, *(len(c.expected) for c in s.cases)])
        got_w = max([3, *(len(got_label(c)) for c in s.cases)])
        lines.append(f"  {'CASE':<{width}}  {'EXPECTED':<{exp_w}}  {'GOT':<{got_w}}  RESULT")
        for c in s.cases:
            name = c.name
            if len(name) > width:  # in full on a line of its own, never cut
                lines.append(f"  {name}")
                name = ""
            lines.append(f"  {name:<{width}}  {c.expected:<{exp_w}}  "
                         f"{got_label(c):<{got_w}}  {'PASS' if c.passed else 'FAIL'}")
            for d in c.differences:
                lines.append(f"      - {d}")
        lines.append("")
    lines.append(summary(results))
    return "\n".join(lines)


def summary(results: list[SuiteResult]) -> str:
    cases = sum(len(s.cases) for s in results)
    failed = sum(s.failed for s in results)
    broken = sum(s.error is not None for s in results)
    text = (f"{len(results)} suite{'s' if len(results) != 1 else ''}, {cases} cases: "
            f"{cases - failed} passed, {failed} failed")
    if broken:
        text += f"; {broken} suite{'s' if broken != 1 else ''} could not run"
    return text


def as_json(results: list[SuiteResult]) -> list[dict[str, Any]]:
    return [{
        "suite": s.path, "name": s.name, "policy": s.policy, "error": s.error,
        "passed": s.error is None and not s.failed,
        "cases": [{
            "name": c.name, "expected": c.expected, "got": c.got.outcome,
            "phase": c.got.phase, "rules": c.got.rules, "tenant": c.got.tenant,
            "message": c.got.message,
            "warnings": c.got.warnings, "changes": c.got.changes, "reserved": c.got.reserved,
            "result": "PASS" if c.passed else "FAIL", "differences": c.differences,
        } for c in s.cases],
    } for s in results]
