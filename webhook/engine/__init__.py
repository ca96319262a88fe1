"""The pure policy engine: (admission request, policy, usage) -> decision.

No I/O and no web framework here: the admission pipeline (``webhook.admission``) runs
:func:`webhook.engine.mutate.mutate` and :func:`webhook.engine.validate.validate`, the
latter handing quota work to it as one of the records of :mod:`webhook.engine.handoff`.
"""
