"""Typed errors of the ReplaySSM state pool. All derive from :class:`PoolError` (a ``ValueError``)."""


class PoolError(ValueError):
    """Base class: a misuse of the pool or an invalid configuration."""


class PoolExhaustedError(PoolError):
    """More slots were requested than are free. Callers queue the request and retry later."""


class DoubleFreeError(PoolError):
    """A slot was freed that is not allocated."""


class BadSlotError(PoolError):
    """A slot index outside ``1..num_slots``, the padding slot 0, or a slot that is not allocated."""


class ConfigError(PoolError):
    """An invalid geometry or precision configuration (window < 1, unsupported dtype combination...)."""


class DraftOverflowError(PoolError):
    """More draft tokens than the ring can hold on top of the committed records."""


class CommitError(PoolError):
    """A commit that does not match the pending verify (no verify pending, too many accepted...)."""
