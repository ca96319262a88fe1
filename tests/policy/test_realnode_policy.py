"""tools/realnode/policy.yaml, the policy tools/realnode/run.sh serves on a real GPU node
(docs/real-gpu-node.md): it loads, and a GPU pod of its tenant is pinned to the product
run.sh writes into it, given the GPU taint's toleration, and held to the 1-GPU cap."""

from __future__ import annotations

from pathlib import Path

from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file, load_text

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "tools" / "realnode" / "policy.yaml"
RUN = ROOT / "tools" / "realnode" / "run.sh"
SHIPPED_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def test_the_realnode_policy_loads_and_compiles() -> None:
    policy = load_file(POLICY)
    compile_policy(policy)
    (tenant,) = policy.spec.tenants
    assert tenant.name == "research"
    assert tenant.quota is not None and tenant.quota.gpus == 1


def test_run_sh_pins_the_product_gpu_feature_discovery_reports() -> None:
    # run.sh replaces the shipped product with GFD's nvidia.com/gpu.product value (sed).
    text = POLICY.read_text()
    assert SHIPPED_PRODUCT in text
    assert f"s/{SHIPPED_PRODUCT}/" in RUN.read_text()
    other = load_text(text.replace(SHIPPED_PRODUCT, "NVIDIA-A100-SXM4-80GB"), "realnode")
    assert other.spec.products.aliases["node-gpu"] == "NVIDIA-A100-SXM4-80GB"
    assert other.spec.products.node_label == "nvidia.com/gpu.product"
