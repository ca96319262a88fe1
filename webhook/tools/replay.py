"""Replay recorded AdmissionReviews against a candidate policy and the current one, and
report which decisions would change: ``gpu-webhook review --replay FILE --policy NEW``.

The input is JSON lines, one full AdmissionReview per line, as captured (an audit log
with request bodies, or the webhook's own traffic). Each review runs through both
policies the way the API server calls the webhook: mutate -> apply the patch ->
validate. Quota is checked against empty usage: what was running when a review was
recorded is not in the recording, so a replay shows the caps a single object can never
fit (a pod above the tenant's quota, a Deployment whose gang cannot fit), not denials
that depended on the cluster's load at the time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import orjson

from webhook.admission.offline import through_both
from webhook.k8s.review import AdmissionRequest, BadReview, parse_review
from webhook.policy.compiled import CompiledPolicy

CHANGES = ("allowed->denied", "denied->allowed", "warnings changed", "patch changed")


@dataclass
class Verdict:
    allowed: bool
    message: str
    warnings: list[str]
    patched: dict[str, Any] | None
    changes: list[str]
    rules: list[str]


@dataclass
class Line:
    number: int
    subject: str
    changes: list[str] = field(default_factory=list)
    baseline: Verdict | None = None
    candidate: Verdict | None = None
    error: str | None = None  # the line is not a usable AdmissionReview


@dataclass
class Report:
    lines: list[Line]

    def count(self, change: str) -> int:
        return sum(change in ln.changes for ln in self.lines)

    @property
    def reviewed(self) -> int:
        return sum(ln.error is None for ln in self.lines)

    @property
    def unchanged(self) -> int:
        return sum(ln.error is None and not ln.changes for ln in self.lines)

    @property
    def unreadable(self) -> int:
        return sum(ln.error is not None for ln in self.lines)


def decide(req: AdmissionRequest, policy: CompiledPolicy) -> Verdict:
    """One recorded review through both webhooks under ``policy``."""
    # Quota against empty usage: a recording does not say what was running at the time.
    out = through_both(req, policy)
    return Verdict(out.allowed, out.message, out.warnings,
                   out.patched if out.allowed else None, list(out.mutating.mutations),
                   out.rules())


def replay(raw_lines: list[bytes], baseline: CompiledPolicy, candidate: CompiledPolicy
           ) -> Report:
    out: list[Line] = []
    for n, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        try:
            req = parse_review(raw)
            before, after = decide(req, baseline), decide(req, candidate)
        except (BadReview, orjson.JSONDecodeError) as exc:
            out.append(Line(n, "", error=str(exc)))
            continue
        line = Line(n, _subject(req), baseline=before, candidate=after)
        if before.allowed and not after.allowed:
            line.changes.append("allowed->denied")
        elif after.allowed and not before.allowed:
            line.changes.append("denied->allowed")
        if sorted(before.warnings) != sorted(after.warnings):
            line.changes.append("warnings changed")
        if before.allowed and after.allowed and before.patched != after.patched:
            line.changes.append("patch changed")
        out.append(line)
    return Report(out)


def _subject(req: AdmissionRequest) -> str:
    name = req.ident.shown(req.name) or "*"
    who = f" by {req.username}" if req.username else ""
    return f"{req.kind} {req.namespace}/{name} ({req.operation}{who})"


def render_text(report: Report, baseline: str, candidate: str) -> str:
    out = [f"replayed {report.reviewed} reviews: baseline {baseline}, candidate {candidate}"]
    for change in CHANGES:
        out.append(f"  {change + ':':<18} {report.count(change)}")
    out.append(f"  {'unchanged:':<18} {report.unchanged}")
    if report.unreadable:
        out.append(f"  {'unreadable lines:':<18} {report.unreadable}")
    changed = [ln for ln in report.lines if ln.changes or ln.error]
    if changed:
        out.append("")
    for ln in changed:
        if ln.error is not None:
            out.append(f"line {ln.number}: not an AdmissionReview, skipped: {ln.error}")
            continue
        assert ln.baseline is not None and ln.candidate is not None
        out.append(f"line {ln.number}: {ln.subject}: {', '.join(ln.changes)}")
        out.extend(f"    {d}" for d in _details(ln.baseline, ln.candidate, ln.changes))
    return "\n".join(out)


def _details(b: Verdict, c: Verdict, changes: list[str]) -> list[str]:
    out: list[str] = []
    if "allowed->denied" in changes:
        out.append(f"now denied: {_first(c.message)} [{', '.join(c.rules)}]")
    if "denied->allowed" in changes:
        out.append(f"was denied: {_first(b.message)}")
    if "warnings changed" in changes:
        out.extend(f"- warning: {_first(w)}" for w in b.warnings if w not in c.warnings)
        out.extend(f"+ warning: {_first(w)}" for w in c.warnings if w not in b.warnings)
    if "patch changed" in changes:
        ops = jsonpatch.make_patch(b.patched or {}, c.patched or {}).patch
        for op in ops[:6]:
            value = f" {_short(op['value'])}" if "value" in op else ""
            out.append(f"patched object: {op['op']} {op['path']}{value}")
        if len(ops) > 6:
            out.append(f"patched object: ... {len(ops) - 6} more differences")
    return out


def _first(text: str) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= 400 else line[:397] + "..."


def _short(value: Any) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= 120 else text[:117] + "..."


def as_json(report: Report) -> dict[str, Any]:
    def verdict(v: Verdict | None) -> dict[str, Any] | None:
        if v is None:
            return None
        return {"allowed": v.allowed, "message": v.message, "warnings": v.warnings,
                "changes": v.changes, "rules": v.rules}

    return {
        "reviewed": report.reviewed,
        "counts": {**{c: report.count(c) for c in CHANGES}, "unchanged": report.unchanged,
                   "unreadable": report.unreadable},
        "lines": [{"line": ln.number, "subject": ln.subject, "changes": ln.changes,
                   "error": ln.error, "baseline": verdict(ln.baseline),
                   "candidate": verdict(ln.candidate)}
                  for ln in report.lines if ln.changes or ln.error],
    }
