"""Every policy YAML shown in the documentation loads with the real loader.

A reader copies snippets from ``policies/README.md`` and ``docs/*.md`` into a policy; a
snippet the loader refuses stops the webhook from starting (``reservationTTLSeconds``
once did). So each ```` ```yaml ```` block is loaded: a whole policy as it is, a
fragment where its top-level keys belong (under ``spec``, or inside a tenant). A block
that is not a policy at all (a node's labels) carries ``<!-- not a policy -->`` on the
line before it. Inline policy field paths (```spec.quotaLedger.x```) must name schema
fields too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from webhook.policy.load import load_text
from webhook.policy.model import GPUPolicy, Spec, Tenant

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "policies" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_A_POLICY = "<!-- not a policy -->"

HEAD = "apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\nmetadata: {name: docs}\n"
# What a tenant fragment needs around it: products its quota may name, and namespaces its
# per-namespace quotas may name.
PRODUCTS = {"aliases": {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3"}}


def _aliases(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def _blocks(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, marked not-a-policy) of each ```yaml block."""
    lines = path.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        if re.fullmatch(r"```ya?ml\s*", lines[i]):
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            marked = start > 0 and lines[start - 1].strip() == NOT_A_POLICY
            out.append((start + 1, "\n".join(body) + "\n", marked))
        i += 1
    return out


SNIPPETS = [(p, line, text, marked) for p in DOCS for line, text, marked in _blocks(p)]


def _as_policy(text: str) -> str | None:
    """The snippet as a whole policy, or None when its keys fit nowhere in one."""
    text = text.replace("{...}", "{}")  # "the rest goes here" in an outline
    raw: Any = yaml.safe_load(text)
    if not isinstance(raw, dict):
        return None
    keys = set(raw)
    if keys <= _aliases(GPUPolicy) and "apiVersion" in keys:
        return text
    if keys <= _aliases(GPUPolicy):
        return HEAD + text
    if keys <= _aliases(Spec):
        return HEAD + yaml.safe_dump({"spec": raw})
    if keys <= _aliases(Tenant):
        tenant: dict[str, Any] = {"name": "docs", "defaultProduct": "a100", **raw}
        if "namespaceSelector" not in raw:
            tenant.setdefault("namespaces", ["research", "research-dev"])
        return HEAD + yaml.safe_dump({"spec": {"products": PRODUCTS, "tenants": [tenant]}})
    return None


def test_the_docs_have_policy_snippets() -> None:
    # Guards the extraction itself: a regex that found nothing would pass every case.
    assert sum(not marked for *_, marked in SNIPPETS) >= 7


@pytest.mark.parametrize(("path", "line", "text", "marked"), SNIPPETS,
                         ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, *_ in SNIPPETS])
def test_snippet_loads(path: Path, line: int, text: str, marked: bool) -> None:
    if marked:
        return  # a pod's or node's YAML, said so next to it in the docs
    policy = _as_policy(text)
    assert policy is not None, (
        f"{path}:{line}: this YAML block is neither a policy nor a fragment of one "
        f"(top-level keys fit no GPUPolicy, spec or tenant); if it is something else "
        f"(a node, a pod), put {NOT_A_POLICY} on the line before it")
    load_text(policy, f"{path.name}:{line}")  # PolicyError names the bad field


def _field_path_ok(dotted: str) -> bool:
    model: type[BaseModel] = GPUPolicy
    if dotted.split(".")[1] not in _aliases(Spec) | {"quotaLedger"}:
        return True  # another object's spec (a Deployment's ``spec.replicas``)
    for part in dotted.split("."):
        fields = {info.alias or name: info for name, info in model.model_fields.items()}
        if part not in fields:
            return False
        annotation = fields[part].annotation
        nested = [t for t in (annotation, *getattr(annotation, "__args__", ()))
                  if isinstance(t, type) and issubclass(t, BaseModel)]
        if not nested:
            return True  # a leaf (or a list/dict of leaves): nothing below to check
        model = nested[0]
    return True


INLINE = [(p, m.group(1)) for p in [*DOCS, ROOT / "README.md"]
          for m in re.finditer(r"`(spec(?:\.[A-Za-z]+)+)`", p.read_text())]


@pytest.mark.parametrize(("path", "dotted"), INLINE,
                         ids=[f"{p.name}:{d}" for p, d in INLINE])
def test_inline_field_paths_name_schema_fields(path: Path, dotted: str) -> None:
    assert _field_path_ok(dotted), f"{path}: `{dotted}` is not a field of the policy schema"
