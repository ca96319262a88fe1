"""The policy: its YAML schema (``model``), loading with located errors (``load``), the
precomputed form the engine runs on (``compiled``, ``spot``), the JSON Schema and CRD made
from the model (``schema``) and a GPUPolicy object checked by the loader (``review``)."""
