"""The admission floor: the one sequence of steps every caller runs.

- :mod:`.webhooks`: the mutating and validating webhooks (and a scale, a gang's DELETE),
  each returning a final :class:`~webhook.engine.decision.Decision`;
- :mod:`.quota`: the validating webhook's quota step against a usage store;
- :mod:`.offline`: one review through both webhooks as the API server would send it,
  outside the HTTP path (``review``, ``--replay``, ``test``, the audit);
- :mod:`.audit`: what the policy would refuse or change among what already runs.

The server (``webhook.server``) and the offline tools (``webhook.tools``) call these and
add only their own I/O.
"""
