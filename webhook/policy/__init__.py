"""The policy: its YAML schema (``model``), loading with located errors (``load``) and
the precomputed form the engine runs on (``compiled``)."""
