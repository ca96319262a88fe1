"""The policy's schema for editors and for the API server, generated from the model.

Two renderings of :mod:`webhook.policy.model`, so neither can drift from what the
loader accepts:

- :func:`json_schema`: JSON Schema (draft 2020-12) of a policy file, published as
  ``policies/schema/gpupolicy.schema.json`` for editors (``# yaml-language-server:
  $schema=...`` at the top of a policy file gives completion, field docs and typo marks).
- :func:`crd`: the ``GPUPolicy`` CustomResourceDefinition (``gpu-webhook.dev/v1alpha1``,
  cluster-scoped) whose OpenAPI v3 schema is the same tree made *structural*, as the API
  server demands: every ``$ref`` inlined, ``anyOf [X, null]`` turned into ``X`` with
  ``nullable``, ``const`` into a one-value ``enum``, no ``additionalProperties: false``
  (the API server prunes unknown fields, and ``kubectl apply``'s strict field validation
  reports them as errors).

Both carry the field docstrings as descriptions. Neither holds the cross-field rules
(a product named but not defined, a namespace in two tenants): those live in the model's
validators, which the validating webhook for GPUPolicy objects runs
(:mod:`webhook.policy.review`).
"""

from __future__ import annotations

import copy
from typing import Any

from webhook.policy.model import API_VERSION, KIND, GPUPolicy

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "gpupolicies"
SCHEMA_PATH = "policies/schema/gpupolicy.schema.json"
"""Where the JSON Schema is published in the repository (tests keep it current)."""

# JSON Schema keywords the structural OpenAPI subset has no use for (titles repeat the
# field name; defaults are left out so an object is stored exactly as applied and the
# loader, which knows the defaults, applies them).
_DROPPED = {"title", "default", "examples", "propertyNames", "$schema", "$id", "$defs"}


def json_schema() -> dict[str, Any]:
    """JSON Schema of a policy file, camelCase as written, with the field docs."""
    schema = _keys_as_property_names(
        GPUPolicy.model_json_schema(by_alias=True, mode="validation"))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **schema,
            "title": "GPUPolicy",
            "description": "A gpu-webhook policy file (gpu-webhook.dev/v1alpha1 GPUPolicy). "
                           "Every field: policies/README.md."}


def _keys_as_property_names(node: Any) -> Any:
    """pydantic writes a map with a key pattern as ``patternProperties``, which lets a key
    that does not match through with any value; ``propertyNames`` + ``additionalProperties``
    says what the model means (every key matches, every value is checked) and has a
    structural form."""
    if isinstance(node, list):
        return [_keys_as_property_names(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _keys_as_property_names(v) for k, v in node.items()}
    patterns = out.get("patternProperties")
    if isinstance(patterns, dict) and len(patterns) == 1 and "additionalProperties" not in out:
        ((pattern, value),) = patterns.items()
        del out["patternProperties"]
        out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
        out["additionalProperties"] = value
    return out


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI v3 (structural) form of a JSON Schema made by :func:`json_schema`."""
    defs = schema.get("$defs", {})
    return _convert(schema, defs, ())


def _convert(node: dict[str, Any], defs: dict[str, Any], seen: tuple[str, ...]
             ) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        if name in seen:
            raise ValueError(f"recursive schema through {name}: a CRD cannot express it")
        # The field's own keys (its description) win over the referenced model's.
        node = {**_convert(defs[name], defs, (*seen, name)), **node}
        seen = (*seen, name)
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = [o for o in node.pop(key) if o != {"type": "null"}]
            if sorted(str(o.get("type")) for o in options) == ["integer", "string"]:
                # A quantity (16, "500m", "128Gi"): the API server's int-or-string.
                node = {**node, "x-kubernetes-int-or-string": True, "nullable": True}
                return {k: v for k, v in node.items() if k not in _DROPPED}
            if len(options) != 1:
                raise ValueError(f"{key} of {len(options)} types: a structural schema "
                                 "needs one type per field")
            nullable = True
            node = {**_convert(options[0], defs, seen), **node, "nullable": nullable}
    if "allOf" in node:
        parts = node.pop("allOf")
        for part in parts:
            node = {**_convert(part, defs, seen), **node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {k: _convert(v, defs, seen) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs, seen)
        elif key == "additionalProperties":
            continue  # false: pruning and strict field validation refuse unknown fields
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020-12 gives the bound; OpenAPI 3.0 a flag on minimum/maximum.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise ValueError(f"a schema node without a type: {sorted(out)}")
    if out.get("type") == "object" and "properties" not in out and \
            "additionalProperties" not in out:
        raise ValueError("an object with no properties would be pruned empty")
    return out


# A condition of the status (Accepted, Active), as Kubernetes' metav1.Condition.
_CONDITION: dict[str, Any] = {
    "type": "object",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {"type": "string", "description": "Accepted or Active."},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {
            "type": "integer", "format": "int64", "minimum": 0,
            "description": "The metadata.generation the condition was set for."},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768,
                    "description": "Why; when refused, the loader's located errors."},
    },
}

# The replicas watching the policy, each with the generation it serves.
_REPLICAS: dict[str, Any] = {
    "type": "array", "maxItems": 1024,
    "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
    "description": "Each webhook replica watching this policy, and the "
                   "metadata.generation it serves.",
    "items": {
        "type": "object", "required": ["name", "servedGeneration"],
        "properties": {
            "name": {"type": "string", "maxLength": 253,
                     "description": "The replica's pod name."},
            "servedGeneration": {
                "type": "integer", "format": "int64", "minimum": 0,
                "description": "The metadata.generation it serves."},
            "lastReportTime": {"type": "string", "format": "date-time"},
        },
    },
}


def _status_schema(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: the schema of the spec, for the copy of the last accepted one."""
    return {
        "type": "object",
        "description": "What the webhook made of this policy.",
        "properties": {
            "tenants": {"type": "integer", "minimum": 0,
                        "description": "Tenants of the policy the replicas serve."},
            "replicas": copy.deepcopy(_REPLICAS),
            "lastAccepted": {
                "type": "object",
                "description": "The last spec a replica accepted: what a replica that starts "
                               "while the spec is refused serves.",
                "properties": {
                    "generation": {"type": "integer", "format": "int64", "minimum": 0},
                    "spec": spec,
                },
            },
            "conditions": {
                "type": "array", "items": copy.deepcopy(_CONDITION),
                "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "description": "Accepted: the policy loads. Active: the webhook replicas "
                               "serve it."},
        },
    }


def crd() -> dict[str, Any]:
    """The GPUPolicy CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    schema = structural(json_schema())
    props = schema["properties"]
    # At the root the API server owns apiVersion, kind and metadata: only their types
    # may be given (the loader checks the name's shape; the webhook shows its message).
    props["apiVersion"] = {"type": "string", "description": API_VERSION}
    props["kind"] = {"type": "string", "description": KIND}
    props["metadata"] = {"type": "object"}
    props["status"] = _status_schema(copy.deepcopy(props["spec"]))
    schema.pop("required", None)  # apiVersion/kind/metadata: always there on an object
    columns = [
        # A JSONPath column shows the first of several values, so the count is status:
        # written by the replica that accepts the policy.
        {"name": "Tenants", "type": "integer", "jsonPath": ".status.tenants",
         "description": "Tenants of the policy the replicas serve."},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode",
         "description": "The default mode (empty: enforce)."},
        {"name": "Active", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Active")].status',
         "description": "Whether the webhook replicas serve this policy."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}",
                     "labels": {"app.kubernetes.io/name": "gpu-webhook"}},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"plural": PLURAL, "singular": "gpupolicy", "kind": KIND,
                      "listKind": f"{KIND}List", "shortNames": ["gpupol"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": copy.deepcopy(schema)},
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
            }],
        },
    }
