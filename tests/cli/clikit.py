"""What several CLI test modules hand the ``gpu-webhook`` command: the trainer pod a
developer reviews (``review -f``), as a manifest file's text."""

from __future__ import annotations

# A pod in tenant research asking for 2 GPUs by limit only: allowed by the example policy,
# with requests, tolerations and node affinity added.
TRAINER = """\
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  namespace: research
spec:
  containers:
    - name: main
      image: pytorch:2
      resources:
        limits:
          nvidia.com/gpu: 2
"""
