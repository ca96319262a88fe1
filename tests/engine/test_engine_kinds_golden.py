"""The built-in training kinds' readers, held to what they returned when each was
written by hand (``tests/golden/workloads/readers.json``): on every workload fixture,
re-keyed for each Kubeflow kind, and on each of those with one field at a time replaced
by a value of another JSON type (or removed), and two fields of one mapping at once
(which of them is read first), the Workload read (kinds, nouns, roles,
counts, minimums, gang, pointers) or the MalformedObject message is the same.

``GOLDEN_REGEN=1`` writes the file again from the readers as they are.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.k8s.objects import MalformedObject
from webhook.k8s.workloads import CRD_KINDS, Workload

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "workloads"
GOLDEN = TESTS / "golden" / "workloads" / "readers.json"

# The keys of the Kubeflow kinds' replica specs: a fixture of one is re-keyed for each.
REPLICA_KEYS = ("pytorchReplicaSpecs", "tfReplicaSpecs", "xgbReplicaSpecs",
                "paddleReplicaSpecs", "jaxReplicaSpecs", "mpiReplicaSpecs")
# Not walked into: what no reader reads past (a pod spec's own fields).
SKIP = {"containers", "initContainers", "volumes", "affinity", "tolerations",
        "annotations", "labels", "env", "args", "command"}
REPLACEMENTS: tuple[Any, ...] = (None, "x", -1, 0, 2, True, [], {}, [None], ...)
# Counts the readers read, set where a fixture leaves them out.
COUNTS = ("replicas", "minAvailable", "parallelism", "completions")


def examples() -> Iterator[tuple[str, dict[str, Any]]]:
    for f in sorted(FIXTURES.glob("*.yaml")):
        for i, doc in enumerate(d for d in yaml.safe_load_all(f.read_text()) if d):
            yield f"{f.stem}#{i}", doc
            spec = doc.get("spec")
            key = next((k for k in REPLICA_KEYS if isinstance(spec, dict) and k in spec), None)
            for other in REPLICA_KEYS if key else ():
                if other != key:
                    d = copy.deepcopy(doc)
                    d["spec"][other] = d["spec"].pop(key)
                    yield f"{f.stem}#{i}:{other}", d


def mutations(obj: Any, path: tuple[Any, ...] = (), depth: int = 0
              ) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, replacement) for each node below the object's top level."""
    if depth > 8:
        return
    items = (obj.items() if isinstance(obj, dict) else enumerate(obj)
             if isinstance(obj, list) else ())
    for k, v in items:
        if k in SKIP or (depth == 0 and k != "spec"):
            continue
        for r in REPLACEMENTS:
            yield (*path, k), r
        yield from mutations(v, (*path, k), depth + 1)


def pairs(obj: Any, path: tuple[Any, ...] = (), depth: int = 0
          ) -> Iterator[tuple[tuple[Any, ...], Any, tuple[Any, ...], Any]]:
    """Two fields of one mapping changed at once (one malformed, the other malformed or
    removed), for which of them is read first."""
    if depth > 8 or not isinstance(obj, (dict, list)):
        return
    keys = [k for k in (obj if isinstance(obj, dict) else range(len(obj)))
            if k not in SKIP and (depth or k == "spec")]
    absent = [k for k in COUNTS if depth and isinstance(obj, dict) and k not in obj]
    if isinstance(obj, dict):
        for a in [*keys, *absent]:
            for b in keys:
                if a != b:
                    yield (*path, a), "x", (*path, b), "x"
                    yield (*path, a), "x", (*path, b), ...
    for k in keys:
        yield from pairs(obj[k], (*path, k), depth + 1)


def mutated(obj: dict[str, Any], path: tuple[Any, ...], value: Any,
            *more: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for at, new in ((path, value), *zip(more[::2], more[1::2], strict=True)):
        cur: Any = out
        for k in at[:-1]:
            cur = cur[k]
        if new is ...:
            if isinstance(cur, dict):
                del cur[at[-1]]
            else:
                cur.pop(at[-1])
        else:
            cur[at[-1]] = new
    return out


def outcome(read: Any, obj: dict[str, Any]) -> Any:
    try:
        w: Workload | None = read(obj)
    except MalformedObject as e:
        return {"malformed": str(e)}
    if w is None:
        return None
    return {"kind": w.kind, "noun": w.noun, "role_word": w.role_word, "gang": w.gang,
            "sequential": w.sequential, "reserves": w.reserves,
            "roles": [{"name": r.name, "pods": r.pods, "minimum": r.minimum,
                       "patchable": r.patchable, "kind": r.template.kind,
                       "is_pod": r.template.is_pod, "pointer": r.template.pointer,
                       "spec": r.template.spec} for r in w.roles]}


def digest(values: list[Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=repr).encode()
                          ).hexdigest()


def current() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in CRD_KINDS:
        kind = f"{b.group}/{b.kind}"
        for name, doc in examples():
            plain = outcome(b.read, doc)
            changed = [outcome(b.read, mutated(doc, p, v)) for p, v in mutations(doc)]
            changed += [outcome(b.read, mutated(doc, *m)) for m in pairs(doc)]
            out[f"{kind} {name}"] = {"read": plain, "mutated": len(changed),
                                     "digest": digest(changed)}
    return out


def test_the_readers_return_what_they_did() -> None:
    got = current()
    if os.environ.get("GOLDEN_REGEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden written")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key]["read"] == want[key]["read"], key
        assert (got[key]["mutated"], got[key]["digest"]) == (
            want[key]["mutated"], want[key]["digest"]), key


def test_the_kinds_described_as_data() -> None:
    described = {b.kind for b in CRD_KINDS if b.roles is not None}
    assert described == {"Job", "CronJob", "JobSet", "PyTorchJob", "TFJob", "XGBoostJob",
                         "PaddleJob", "JAXJob", "MPIJob"}
    for b in CRD_KINDS:
        if b.roles is not None:
            assert b.templates == b.roles.templates()
