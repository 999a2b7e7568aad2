"""Former home of the ``replayssm:*`` metric table, now ``sglang_replayssm.accounting``; kept only because
``native/engine.py`` still imports ``metric_names.ring_occupancy`` (delete once it imports accounting)."""

from sglang_replayssm.accounting import COUNTERS, GAUGES, ring_occupancy  # noqa: F401
