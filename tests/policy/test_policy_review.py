"""``check_document``: a GPUPolicy object as the API server sends it, checked by the
policy loader, with the messages ``gpu-webhook policy check`` gives for the same file
(located by field path; the object has no lines of the user's file)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.policy.review import check_document

ROOT = Path(__file__).resolve().parents[2]
GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))


def _stored(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with what the API server adds to every object it stores."""
    obj = copy.deepcopy(doc)
    obj["metadata"].update(
        uid="0b0f7c1e-2f49-4f0e-9d2a-8c1e5b1f0a11", generation=3, resourceVersion="812",
        creationTimestamp="2026-12-01T10:00:00Z",
        annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"},
        managedFields=[{"manager": "kubectl", "operation": "Update"}])
    obj["status"] = {"conditions": [{"type": "Accepted", "status": "True"}]}
    return obj


def _example() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "policies" / "multi-tenant.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_example_as_a_stored_object_loads() -> None:
    assert check_document(_stored(_example())) == []


def _undefined_product(d: dict[str, Any]) -> None:
    d["spec"]["tenants"][0]["allowedProducts"] = ["a100", "b200"]


def _two_tenants_one_namespace(d: dict[str, Any]) -> None:
    d["spec"]["tenants"][-1]["namespaces"].append(d["spec"]["tenants"][0]["namespaces"][0])


def _typo(d: dict[str, Any]) -> None:
    d["spec"]["unassignedNamespace"] = "deny"


@pytest.mark.parametrize("edit", [_undefined_product, _two_tenants_one_namespace, _typo])
def test_a_bad_edit_gets_the_message_policy_check_gives(edit: Any, tmp_path: Path) -> None:
    doc = _example()
    edit(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([GPU_WEBHOOK, "policy", "check", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    # policy check: "FILE:LINE: spec.x: what"; the object: "GPUPolicy NAME: spec.x: what".
    from_file = [line.split(": ", 1)[1] for line in done.stderr.splitlines()
                 if line.startswith(str(path))]
    problems = check_document(_stored(doc))
    assert problems and all(p.startswith("GPUPolicy shared-gpu-cluster: ") for p in problems)
    assert [p.split(": ", 1)[1] for p in problems] == from_file


def test_a_name_the_loader_refuses_is_reported_at_metadata_name() -> None:
    doc = _example()
    doc["metadata"]["name"] = "shared.gpu"  # a valid object name, not a DNS label
    (problem,) = check_document(doc)
    assert problem.startswith("GPUPolicy shared.gpu: metadata.name: must be a DNS label")


def test_an_object_without_metadata_is_reported_not_raised() -> None:
    (problem,) = check_document({"apiVersion": "gpu-webhook.dev/v1alpha1", "kind": "GPUPolicy"})
    assert problem == "GPUPolicy: metadata: required field is missing"
