"""The exceptions the package raises. Every one is a :class:`ForesightError`."""

from __future__ import annotations


class ForesightError(Exception):
    """A failure of the job's exchange with the parameter server.

    ``reason`` is the parameter server's reason label when it refused (``unauthorized``,
    ``shape_mismatch``, ``layout_mismatch``, ``unknown_worker``, ...; docs/protocol.md lists
    them), ``status`` its HTTP status, and ``permanent`` says that no retry, by this process or a
    new one, can succeed (the job's configuration or the model is wrong).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        status: int | None = None,
        permanent: bool = False,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.permanent = permanent


class RefusedError(ForesightError):
    """The parameter server refused a request (after retries, for refusals that may pass)."""


class UnreachableError(ForesightError):
    """The parameter server could not be reached for longer than the job's deadline."""


class ConfigError(ForesightError, ValueError):
    """The job's configuration cannot work: the environment does not describe a job (run under
    ``foresight run`` or in a TrainingJob), a setting is invalid, or the script uses the package
    in a way it cannot honour (a learning-rate scheduler on the Optimizer, sparse gradients).
    Always permanent: an uncaught one ends the worker with exit status 3, which fails the job
    instead of restarting the worker into the same error. A ``ValueError`` too, as invalid
    arguments are in Python."""

    def __init__(self, message: str, *, reason: str | None = "config", status: int | None = None, permanent: bool = True) -> None:
        super().__init__(message, reason=reason or "config", status=status, permanent=True)
