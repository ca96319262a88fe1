"""``gpu-webhook admission-review``: the AdmissionReview the API server would send for a
manifest (to POST with curl), and a reply read back with its patch decoded. The README's
tour runs both against a live server (tests/cli/test_readme_tour.py); here, each case a
user can meet, with the replies the server's own reply builder makes."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import yaml

from webhook.k8s.reply import error_response, response

Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer-0"},
       "spec": {"containers": [{"name": "trainer", "image": "pytorch/pytorch",
                                "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
PATCH = [{"op": "add", "path": "/spec/containers/0/resources/requests",
          "value": {"nvidia.com/gpu": 2}},
         {"op": "add", "path": "/spec/tolerations",
          "value": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}]


def test_a_manifest_becomes_the_review_the_api_server_sends(gpu_webhook: Run,
                                                            tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(POD))
    done = gpu_webhook("admission-review", "-f", "pod.yaml", "--namespace", "research",
                       "--dry-run")
    assert done.returncode == 0, done.stderr
    review = orjson.loads(done.stdout)
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    req = review["request"]
    uuid.UUID(req["uid"])  # a fresh uid, as the API server gives each request
    assert req["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert req["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (req["namespace"], req["name"], req["operation"]) == ("research", "trainer-0",
                                                                 "CREATE")
    assert req["dryRun"] is True
    assert req["object"] == POD


def test_one_object_per_review(gpu_webhook: Run) -> None:
    done = gpu_webhook("admission-review", "-f", "-", stdin=yaml.safe_dump_all([POD, POD]))
    assert done.returncode == 2
    assert "one object per review, the file holds 2" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_reply_is_printed_with_its_patch_decoded(gpu_webhook: Run) -> None:
    reply = orjson.dumps(response("u1", True, warnings=["spot: tolerated"], patch=PATCH))
    done = gpu_webhook("admission-review", "--reply", "-", stdin=reply.decode())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "allowed",
        "warning: spot: tolerated",
        "patch (2 JSONPatch operations, decoded):",
        '  add /spec/containers/0/resources/requests {"nvidia.com/gpu":2}',
        '  add /spec/tolerations [{"key":"nvidia.com/gpu","operator":"Exists",'
        '"effect":"NoSchedule"}]',
    ]
    as_json = gpu_webhook("admission-review", "--reply", "-", "-o", "json",
                          stdin=reply.decode())
    assert orjson.loads(as_json.stdout)["patch"] == PATCH


def test_a_denial_prints_its_message_and_exits_1(gpu_webhook: Run) -> None:
    for reply, shown in ((response("u2", False, "over quota"), "denied (HTTP 403): over quota"),
                         (error_response("u3", "no policy"), "denied (HTTP 500): no policy")):
        done = gpu_webhook("admission-review", "--reply", "-", stdin=orjson.dumps(reply).decode())
        assert done.returncode == 1
        assert done.stdout.strip() == shown


def test_what_is_not_a_reply_is_said(gpu_webhook: Run) -> None:
    for body, said in (("not json", "not JSON"),
                       ('{"error": "request body is not JSON"}',
                        "the webhook refused the review itself: request body is not JSON"),
                       (orjson.dumps({"apiVersion": "admission.k8s.io/v1",
                                      "response": {"allowed": True, "patchType": "JSONPatch",
                                                   "patch": "%%%"}}).decode(),
                        "the patch is not base64 of a JSON list")):
        done = gpu_webhook("admission-review", "--reply", "-", stdin=body)
        assert done.returncode == 2
        assert said in done.stderr, done.stderr
