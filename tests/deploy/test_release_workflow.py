"""The release workflow (.github/workflows/release.yml). It cannot run here (no registry,
no GitHub runner): what can be checked is. Its version step is run as written, for the
tag of this version and for another; the image is the Dockerfile at the root, built for
amd64 and arm64 and pushed to the repository the chart and deploy/base default to; the
chart is packaged and pushed as an OCI artifact."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_kustomize import kustomize

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def step(job: str, key: str, value: str) -> dict[str, Any]:
    [found] = [s for s in workflow()["jobs"][job]["steps"] if str(s.get(key, "")) == value
               or str(s.get(key, "")).startswith(value + "@")]
    return found


def run_version_check(tag: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = step("versions", "id", "check")["run"]
    out = tmp_path / "github_output"
    env = {**os.environ, "GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(out)}
    # The step's heredoc, run by the interpreter the step names.
    body = script.split("<<'EOF'\n", 1)[1].rsplit("EOF", 1)[0]
    return subprocess.run([sys.executable, "-c", body], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=60, check=False)


def test_a_tag_of_this_version_releases(tmp_path: Path) -> None:
    done = run_version_check(f"v{VERSION}", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "github_output").read_text() == f"version={VERSION}\n"


def test_a_tag_of_another_version_is_refused_naming_each_place(tmp_path: Path) -> None:
    done = run_version_check("v9.9.9", tmp_path)
    assert done.returncode != 0
    for where in ("pyproject.toml version", "Chart.yaml version", "Chart.yaml appVersion",
                  "values.yaml image.tag", "deploy/base images: newTag"):
        assert f"{where} is {VERSION}" in done.stderr, done.stderr


def test_the_image_is_the_dockerfile_for_two_architectures() -> None:
    wf = workflow()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+"]
    build = step("image", "uses", "docker/build-push-action")["with"]
    assert build["file"] == "Dockerfile" and (ROOT / build["file"]).is_file()
    assert build["context"] == "."
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["push"] is True
    assert step("image", "uses", "docker/setup-qemu-action")  # arm64 built on amd64
    assert wf["jobs"]["image"]["permissions"]["packages"] == "write"


def test_the_image_goes_where_the_chart_and_kustomize_look() -> None:
    image = workflow()["env"]["IMAGE"]
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpu-webhook" / "values.yaml")
                            .read_text())["image"]
    assert values == {"repository": image, "tag": VERSION, "pullPolicy": "IfNotPresent"}
    base = yaml.safe_load((ROOT / "deploy" / "base" / "kustomization.yaml").read_text())
    assert base["images"] == [{"name": "gpu-webhook", "newName": image, "newTag": VERSION}]
    [deployment] = [o for o in kustomize(ROOT / "deploy" / "overlays" / "self-managed")
                    if o["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{image}:{VERSION}"


def test_the_chart_is_packaged_at_the_tag_and_pushed_as_oci() -> None:
    wf = workflow()
    assert wf["env"]["CHARTS"].startswith("oci://")
    script = step("chart", "name", "package and push the chart")["run"]
    assert 'helm package deploy/helm/gpu-webhook --version "$VERSION"' in script
    assert 'helm push "dist/gpu-webhook-$VERSION.tgz" "$CHARTS"' in script
    assert wf["jobs"]["chart"]["needs"] == ["versions", "image"]  # never a chart without image


@pytest.mark.parametrize("readme", ["README.md"])
def test_the_readme_says_how_to_build_and_use_your_own_image(readme: str) -> None:
    text = (ROOT / readme).read_text()
    section = text.split("\n### Build your own image\n", 1)[1].split("\n## ", 1)[0]
    assert "make image IMAGE=" in section
    assert "--set image.repository=" in section and "kustomize edit set image" in section
    assert re.search(r"release\.yml", section)
