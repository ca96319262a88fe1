"""The offline tools' name for the admission pipeline run through both webhooks
(:mod:`webhook.pipeline`): what ``review``, ``review --replay`` and ``test`` run. It
lives below the tools so that the server's background audit runs the very same code."""

from webhook.pipeline import ClaimBook, Outcome, as_stored, through_both

__all__ = ["ClaimBook", "Outcome", "as_stored", "through_both"]
