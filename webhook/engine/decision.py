"""What the engine returns, and how findings become allow / warn / deny.

Each rule reports a :class:`Finding`; the rule's mode (enforce, warn, audit) decides
what the finding does. ``Decision`` carries everything an adapter needs: the verdict,
the denial message, warnings for kubectl, the JSON Patch and what to log and count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhook.engine import messages
from webhook.policy.compiled import CompiledPolicy, TenantRules
from webhook.policy.model import Mode, Rule

PROVENANCE_ANNOTATION = "gpu-webhook.dev/mutated"
_SEVERITY = {Mode.AUDIT: 0, Mode.WARN: 1, Mode.ENFORCE: 2}


@dataclass(slots=True)
class Finding:
    rule: Rule
    mode: Mode
    message: str


@dataclass(slots=True)
class Ask:
    """What one admitted object would add to its tenant's usage (for quota)."""

    tenant: str
    namespace: str
    product: str | None
    resources: dict[str, float]  # per pod, effective request in devices
    gpus: float  # per pod, GPU-equivalents
    pods: int  # pods of this template at once (replicas / parallelism; 1 for a Pod)
    is_pod: bool
    pods_added: int  # pods this request adds (an UPDATE that scales 2 -> 5 adds 3)
    kind: str


@dataclass(slots=True)
class Decision:
    allowed: bool = True
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)  # names of changes made
    tenant: str | None = None
    skipped: str | None = None  # why no rule ran: kind, operation, exempt, no-gpu
    gpus: float = 0.0  # GPU-equivalents the object asks for (per pod)
    ask: Ask | None = None  # what admitting it adds to quota usage (validating phase)
    subject: str = ""  # "pod team-a/trainer-0", for messages written after the engine

    @property
    def outcome(self) -> str:
        """One word for logs and metrics: allowed, denied, warned, audited or skipped."""
        if not self.allowed:
            return "denied"
        if self.warnings:
            return "warned"
        if self.findings:
            return "audited"
        return "skipped" if self.skipped else "allowed"


class Checker:
    """Collects findings for one object, applying each rule's mode.

    ``owned`` rules belong to the current phase. A rule owned by the other phase is
    re-checked only to enforce (it denies in enforce mode and is otherwise silent), so a
    warn-mode finding is reported once, by the webhook that owns it, not twice.
    """

    __slots__ = ("decision", "owned", "policy", "subject", "tenant")

    def __init__(self, policy: CompiledPolicy, tenant: TenantRules | None, subject: str,
                 owned: frozenset[Rule], decision: Decision) -> None:
        self.policy = policy
        self.tenant = tenant
        self.subject = subject
        self.owned = owned
        self.decision = decision

    def mode(self, rule: Rule) -> Mode:
        return self.policy.mode_for(rule, self.tenant)

    def report(self, rule: Rule, text: str, where: str | None = None,
               at_most: Mode | None = None) -> Mode:
        """Record a violation; returns the mode it was handled in. ``at_most`` caps the
        severity (a workload that does not fit *now* only ever warns)."""
        mode = self.mode(rule)
        if at_most is not None and _SEVERITY[at_most] < _SEVERITY[mode]:
            mode = at_most
        if rule not in self.owned and mode is not Mode.ENFORCE:
            return mode
        subject = f"{self.subject}, {where}" if where else self.subject
        tenant = self.tenant.name if self.tenant else None
        message = f"{subject}: {text} {messages.tag(rule, self.policy.name, tenant)}"
        self.decision.findings.append(Finding(rule, mode, message))
        if mode is Mode.ENFORCE:
            self.decision.allowed = False
        elif mode is Mode.WARN:
            self.decision.warnings.append(message)
        return mode

    def finish(self) -> Decision:
        d = self.decision
        if not d.allowed:
            d.message = "\n".join(f.message for f in d.findings if f.mode is Mode.ENFORCE)
            d.patch = []  # a denial carries no patch
        return d


def subject_of(kind: str, namespace: str, obj: dict[str, Any], request_name: str) -> str:
    """``pod team-a/trainer-0``; ``deployment team-a/web`` for a workload's template."""
    meta = obj.get("metadata")
    name = request_name
    if isinstance(meta, dict):
        name = name or _s(meta.get("name"))
        if not name and _s(meta.get("generateName")):
            name = _s(meta.get("generateName")) + "*"
    name = name or "(unnamed)"
    ref = f"{namespace}/{name}" if namespace else name
    if kind == "Pod":
        return f"pod {ref}"
    return f"{kind.lower()} {ref}, pod template"


def _s(v: object) -> str:
    return v if isinstance(v, str) else ""
