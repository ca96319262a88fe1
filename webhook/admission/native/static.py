"""The webhook configurations and the native admission policies as files the API server
loads at start (manifest-based admission control, KEP-5793: beta in 1.37, feature gate
``ManifestBasedAdmissionControlConfig``), for self-managed control planes: active from
the API server's first request, invisible to the API and so beyond the reach of anyone
who may delete admission objects, and independent of etcd.

The API server reads one directory per admission plugin, each holding only that
plugin's kinds, and every object's name must end in ``.static.k8s.io`` (a binding names
its policy by that name). :func:`files` lays them out, with the AdmissionConfiguration
that points ``--admission-control-config-file`` at them. Pure: the command writes them.
"""

from __future__ import annotations

from typing import Any

import yaml

SUFFIX = ".static.k8s.io"
CONFIGURATION = "admission-configuration.yaml"
# Each admission plugin, its directory, the kinds it loads and its configuration's kind.
PLUGINS = (
    ("MutatingAdmissionWebhook", "mutating-webhooks", ("MutatingWebhookConfiguration",),
     "WebhookAdmissionConfiguration"),
    ("ValidatingAdmissionWebhook", "validating-webhooks",
     ("ValidatingWebhookConfiguration",), "WebhookAdmissionConfiguration"),
    ("MutatingAdmissionPolicy", "mutating-policies",
     ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"),
     "MutatingAdmissionPolicyConfiguration"),
    ("ValidatingAdmissionPolicy", "validating-policies",
     ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
     "ValidatingAdmissionPolicyConfiguration"),
)


def files(objects: list[dict[str, Any]], root: str) -> dict[str, str]:
    """``relative path -> text`` of the manifests and the AdmissionConfiguration, whose
    directories are under ``root`` (where the files will be on the control plane's
    host: an absolute path)."""
    if not root.startswith("/"):
        raise ValueError(f"the API server needs an absolute path for its manifests, not "
                         f"{root!r}")
    root = root.rstrip("/") or "/"
    out: dict[str, str] = {}
    plugins = []
    for plugin, directory, kinds, config_kind in PLUGINS:
        docs = [_static(o) for o in objects if o["kind"] in kinds]
        if not docs:
            continue
        out[f"{directory}/gpu-webhook.yaml"] = yaml.safe_dump_all(docs, sort_keys=False)
        configuration: dict[str, Any] = {
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": config_kind}
        if config_kind == "WebhookAdmissionConfiguration":
            configuration["kubeConfigFile"] = ""
        configuration["staticManifestsDir"] = f"{root}/{directory}"
        plugins.append({"name": plugin, "configuration": configuration})
    out[CONFIGURATION] = yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": plugins}, sort_keys=False)
    return out


def _static(obj: dict[str, Any]) -> dict[str, Any]:
    """The object named as the API server requires of a file's (a binding's policy too)."""
    out = {**obj, "metadata": {**obj["metadata"], "name": obj["metadata"]["name"] + SUFFIX}}
    if "policyName" in (obj.get("spec") or {}):
        out["spec"] = {**obj["spec"], "policyName": obj["spec"]["policyName"] + SUFFIX}
    return out
