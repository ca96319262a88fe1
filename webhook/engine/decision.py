"""What the engine returns, and how findings become allow / warn / deny.

Each rule reports a :class:`Finding` to a :class:`Checker`; the rule's mode (enforce,
warn, audit) decides what the finding does. A :class:`Decision` is the final result:
the verdict, the denial message, warnings for kubectl, the JSON Patch and what to log
and count. It is built in one place (:meth:`Decision.of`), from the findings, whether
they come from the engine alone or from the engine and the quota commit after it
(:meth:`Decision.adding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.engine import messages
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import MalformedObject
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.policy.tenantrules import TenantRules

PROVENANCE_ANNOTATION = "gpu-webhook.dev/mutated"
_SEVERITY = {Mode.AUDIT: 0, Mode.WARN: 1, Mode.ENFORCE: 2}


@dataclass(frozen=True, slots=True)
class Finding:
    rule: Rule
    mode: Mode
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one review. Made by :meth:`of` (rules ran), :meth:`skip` (no rule
    applies) or :func:`malformed` (the object cannot be read); never edited after."""

    allowed: bool = True
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)  # names of changes made
    tenant: str | None = None
    skipped: str | None = None  # why no rule ran: kind, operation, exempt, no-gpu, ...
    # What went wrong on the way that operators count (metrics), though the developer's
    # answer already says it: "ledger-unavailable", "scale-unchecked".
    faults: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, findings: Sequence[Finding], *, tenant: str | None,
           patch: Sequence[dict[str, Any]] = (), mutations: Sequence[str] = (),
           faults: Sequence[str] = ()) -> Decision:
        """The decision the findings make: denied when one is enforced (and then without
        a patch: a denial carries none), with every warn-mode finding as a warning."""
        denials = [f.message for f in findings if f.mode is Mode.ENFORCE]
        return cls(
            allowed=not denials,
            message="\n".join(denials),
            warnings=[f.message for f in findings if f.mode is Mode.WARN],
            patch=[] if denials else list(patch),
            findings=list(findings),
            mutations=list(mutations),
            tenant=tenant,
            faults=list(faults),
        )

    @classmethod
    def skip(cls, why: str, tenant: str | None = None) -> Decision:
        return cls(skipped=why, tenant=tenant)

    def adding(self, findings: Sequence[Finding], faults: Sequence[str] = ()) -> Decision:
        """This decision with more findings (the quota commit's), decided again."""
        if not findings and not faults:
            return self
        if not self.allowed and not self.findings:  # a malformed object: final already
            return self
        out = Decision.of([*self.findings, *findings], tenant=self.tenant, patch=self.patch,
                          mutations=self.mutations, faults=[*self.faults, *faults])
        return replace(out, skipped=self.skipped)

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


def malformed(subject: str, exc: MalformedObject) -> Decision:
    """The one denial of an object the engine cannot read (the API server would refuse
    it too): it names the JSON Pointer and what it must be. Fail closed, clearly."""
    return Decision(allowed=False,
                    message=f"{subject}: {messages.malformed(exc.pointer, exc.expected)}")


class Checker:
    """Collects the findings for one object, applying each rule's mode.

    ``owned`` rules belong to the current phase. A rule owned by the other phase is
    re-checked only to enforce (it denies in enforce mode and is otherwise silent), so a
    warn-mode finding is reported once, by the webhook that owns it, not twice.
    """

    __slots__ = ("findings", "owned", "policy", "subject", "tenant")

    def __init__(self, policy: CompiledPolicy, tenant: TenantRules | None, subject: str,
                 owned: frozenset[Rule]) -> None:
        self.policy = policy
        self.tenant = tenant
        self.subject = subject
        self.owned = owned
        self.findings: list[Finding] = []

    def mode(self, rule: Rule) -> Mode:
        return self.policy.mode_for(rule, self.tenant)

    @property
    def denied(self) -> bool:
        return any(f.mode is Mode.ENFORCE for f in self.findings)

    def adds_nothing(self, rule: Rule, beside: Rule) -> bool:
        """Whether a finding of ``rule`` says nothing that one of ``beside`` on the same
        fault does not: both of this phase (or neither), and ``rule`` no more severe."""
        return ((rule in self.owned) == (beside in self.owned)
                and _SEVERITY[self.mode(rule)] <= _SEVERITY[self.mode(beside)])

    def reported(self, rule: Rule) -> bool:
        return any(f.rule is rule for f in self.findings)

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
        self.findings.append(Finding(rule, mode, message))
        return mode

    def notice(self, rule: Rule, text: str, where: str | None = None) -> None:
        """Tell the developer of a change made to their object for ``rule`` (a warning
        kubectl shows), by the phase that makes it; nothing in audit mode."""
        if rule not in self.owned or self.mode(rule) is Mode.AUDIT:
            return
        subject = f"{self.subject}, {where}" if where else self.subject
        tenant = self.tenant.name if self.tenant else None
        self.findings.append(Finding(
            rule, Mode.WARN, f"{subject}: {text} {messages.tag(rule, self.policy.name, tenant)}"))

    def decide(self, patch: Sequence[dict[str, Any]] = (), mutations: Sequence[str] = ()
               ) -> Decision:
        return Decision.of(self.findings, tenant=self.tenant.name if self.tenant else None,
                           patch=patch, mutations=mutations)


class Quiet(Checker):
    """A checker that records nothing: for charging a pod seen in the cluster, where the
    rules already ran at admission and nobody is there to read a finding."""

    __slots__ = ()

    def report(self, rule: Rule, text: str, where: str | None = None,
               at_most: Mode | None = None) -> Mode:
        return Mode.AUDIT

    def notice(self, rule: Rule, text: str, where: str | None = None) -> None:
        return None


def subject_of(kind: str, namespace: str, obj: dict[str, Any], request_name: str) -> str:
    """``pod team-a/trainer-0``; ``deployment team-a/web`` for a workload's template."""
    name = ObjectId.of(obj).shown(request_name) or "(unnamed)"
    ref = f"{namespace}/{name}" if namespace else name
    if kind == "Pod":
        return f"pod {ref}"
    return f"{kind.lower()} {ref}, pod template"
