"""The scheduler's error for a bad flag or an unusable Ray cluster (printed as `error: --flag: reason`)."""

from __future__ import annotations


class SchedulerError(RuntimeError):
    """A bad scheduler flag or an unusable Ray cluster; `flag` names the flag to fix."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"{flag}: {message}")
        self.flag = flag
