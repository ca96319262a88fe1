"""The published policy schema (policies/schema/gpupolicy.schema.json) and the GPUPolicy
CRD (deploy/base/crd-gpupolicy.yaml): each is what the model generates now, every shipped
policy validates against the schema, a typo fails it, and every policy file names the
schema for editors on its first line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from webhook.policy import schema

ROOT = Path(__file__).resolve().parents[2]
GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))
PUBLISHED = ROOT / schema.SCHEMA_PATH
POLICY_FILES = sorted(
    [p for p in (ROOT / "policies").rglob("*.yaml")
     if re.search(r"^kind: GPUPolicy\s*$", p.read_text(), re.M)]
    + [ROOT / "webhook" / "defaults" / "policy.yaml", ROOT / "deploy" / "base" / "policy.yaml"])
IDS = [str(p.relative_to(ROOT)) for p in POLICY_FILES]
VALIDATOR = jsonschema.Draft202012Validator(schema.json_schema())


def _run(*args: str) -> str:
    done = subprocess.run([GPU_WEBHOOK, *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_schema_is_itself_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema.json_schema())


def test_the_published_schema_is_what_the_model_generates() -> None:
    assert PUBLISHED.read_text() == _run("policy", "schema"), (
        f"{schema.SCHEMA_PATH} is stale: gpu-webhook policy schema > {schema.SCHEMA_PATH}")


def test_the_committed_crd_is_what_the_model_generates() -> None:
    assert (ROOT / "deploy" / "base" / "crd-gpupolicy.yaml").read_text() == _run(
        "policy", "crd"), ("deploy/base/crd-gpupolicy.yaml is stale: "
                           "gpu-webhook policy crd > deploy/base/crd-gpupolicy.yaml")


@pytest.mark.parametrize("path", POLICY_FILES, ids=IDS)
def test_every_policy_file_validates_and_names_the_schema_on_its_first_line(
        path: Path) -> None:
    text = path.read_text()
    first = text.splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, f"{path.name}: first line must be `# yaml-language-server: $schema=...`"
    if path.is_relative_to(ROOT / "policies") or path.is_relative_to(ROOT / "deploy"):
        # A relative path, so an editor in a clone finds the file (the embedded copy
        # is byte-identical to policies/multi-tenant.yaml and shares its line).
        assert (path.parent / match[1]).resolve() == PUBLISHED
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(text))]
    assert not errors


def _example() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "policies" / "multi-tenant.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _errors(doc: dict[str, Any]) -> list[str]:
    # An optional field is anyOf [its schema, null]: the error that names the field is
    # in the context of the anyOf's.
    def flat(errors: Any) -> list[Any]:
        return [x for e in errors for x in (e, *flat(e.context or []))]
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in flat(VALIDATOR.iter_errors(doc))]


@pytest.mark.parametrize(("where", "edit", "expected"), [
    ("a misspelt field", lambda d: d["spec"]["tenants"][0].update(allowedProduct=["a100"]),
     "spec.tenants.0: Additional properties are not allowed ('allowedProduct'"),
    ("a misspelt mode", lambda d: d["spec"].update(mode="enforcing"),
     "spec.mode: 'enforcing' is not one of"),
    ("a negative quota", lambda d: d["spec"]["tenants"][0]["quota"].update(gpus=-1),
     "spec.tenants.0.quota.gpus: -1 is less than the minimum of 0"),
    ("an alias that is not a DNS label", lambda d: d["spec"]["products"]["aliases"].update(
        {"A100": "x"}), "spec.products.aliases: 'A100' does not match"),
    ("a wrong kind", lambda d: d.update(kind="GpuPolicy"), "kind: 'GPUPolicy' was expected"),
])
def test_a_mistake_fails_the_schema_at_its_field(where: str, edit: Any, expected: str
                                                  ) -> None:
    doc = _example()
    edit(doc)
    errors = _errors(doc)
    assert any(e.startswith(expected) for e in errors), (where, errors)


def _nodes(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(node, dict):
        return []
    out = [(path, node)]
    for key, child in node.get("properties", {}).items():
        out += _nodes(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out += _nodes(node[key], f"{path}[{key}]")
    return out


def test_the_crd_schema_is_structural() -> None:
    (version,) = schema.crd()["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]
    for path, node in _nodes(root):
        where = path or "(root)"
        # A quantity (16, "128Gi") is int-or-string, the one typeless node allowed.
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{where}: no type"
        assert not {"$ref", "anyOf", "oneOf", "allOf", "const", "propertyNames",
                    "patternProperties", "default"} & set(node), (where, sorted(node))
        assert node.get("additionalProperties") is not False, where
        assert not ("properties" in node and "additionalProperties" in node), where
        assert "x-kubernetes-preserve-unknown-fields" not in node, where
        for bound in ("minimum", "maximum"):
            assert not isinstance(node.get(bound, 0), bool), (where, bound)
        for flag in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(flag, True), bool), (where, flag)
        if node.get("type") == "object" and path != ".metadata":
            assert "properties" in node or "additionalProperties" in node, where
    # The field docs reach the API server (kubectl explain gpupolicy.spec...).
    spec = root["properties"]["spec"]["properties"]
    assert spec["unassignedNamespaces"]["description"].startswith("GPU pods in a namespace")
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Tenants", "Mode", "Active", "Age"]
    assert version["subresources"] == {"status": {}}
