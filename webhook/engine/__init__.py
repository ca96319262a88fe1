"""The pure policy engine: (admission request, policy, usage) -> decision.

No I/O and no web framework here: the HTTPS server, the ``review`` and ``test`` commands
all call :func:`webhook.engine.mutate.mutate` and :func:`webhook.engine.validate.validate`.
"""
