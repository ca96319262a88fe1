"""A GPUPolicy object, as the API server sends it for admission, checked by the loader.

The CRD's schema refuses what a schema can say (a misspelt field, a bad value), but not
what only the model's validators know: a product a tenant names that is not defined, a
namespace in two tenants, a per-product quota without a default product. The validating
webhook for GPUPolicy objects runs :func:`check_document` so such an edit is refused at
``kubectl apply`` with the message ``gpu-webhook policy check`` gives for the same file.

The object is the same document as a policy file, plus what the API server adds
(``metadata.uid``, ``generation``, ``managedFields``, annotations such as
``kubectl.kubernetes.io/last-applied-configuration``, ``status``): those are left out
before the check, since a policy file may not have them. The messages name the object
and the field path; a file line would point into a YAML the user never wrote.
"""

from __future__ import annotations

from typing import Any

import yaml

from webhook.policy.load import PolicyError, Problem, load_text
from webhook.policy.model import GPUPolicy


def load_object(obj: dict[str, Any]) -> GPUPolicy:
    """The policy of a GPUPolicy object; PolicyError with located messages (field paths,
    no file lines) when the loader refuses it."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    source = f"GPUPolicy {name}" if isinstance(name, str) and name else "GPUPolicy"
    document = {k: v for k, v in obj.items() if k != "status"}
    if isinstance(metadata, dict):
        document["metadata"] = {k: v for k, v in metadata.items() if k == "name"}
    try:
        return load_text(yaml.safe_dump(document, sort_keys=False), source)
    except PolicyError as exc:
        raise PolicyError(source, [Problem(p.path, None, p.message)
                                   for p in exc.problems]) from None


def check_document(obj: dict[str, Any]) -> list[str]:
    """The loader's problems with a GPUPolicy object, one located message each; empty
    when the policy loads."""
    try:
        load_object(obj)
    except PolicyError as exc:
        return [p.render(exc.source) for p in exc.problems]
    return []
