"""Typed failures of the core. Expected outcomes are verdicts (see stages.py); these are for the
unexpected, raised by stages and mapped by the pipeline: Retryable → back-off and try again,
Permanent → the pod fails with the error's reason."""

from __future__ import annotations


class AgentError(Exception):
    """Base of nodeagent's own errors."""

    reason: str = "Error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class Retryable(AgentError):
    """Try again later (a runtime that is unavailable, a driver that is not registered yet)."""


class Permanent(AgentError):
    """Trying again will not help; the pod fails with ``reason``."""


class InvalidInput(Permanent):
    reason = "InvalidInput"


class IllegalTransition(AgentError):
    """A lifecycle transition not in the table: always a bug in the agent."""


class PluginError(AgentError):
    """A plugin or profile is not valid; raised at load time, before anything runs."""
