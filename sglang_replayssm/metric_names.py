"""The ``replayssm:*`` Prometheus metrics: one definition, shared by the native engine and the SGLang plugin.

Both engines export these names with these meanings (``deploy/grafana`` panels read them so):

* ``replayssm:flushes_total``             sequence steps (decode rows, and verify rows at their commit) that
                                          folded the record ring into the checkpoint
* ``replayssm:nonflush_steps_total``      sequence steps that only appended records (no state write)
* ``replayssm:state_bytes_read_total``    SSM state bytes read by those steps (from shapes)
* ``replayssm:state_bytes_written_total`` SSM state bytes written by those steps (from shapes)
* ``replayssm:conventional_state_bytes_total`` bytes a conventional engine reads + writes for the same tokens
* ``replayssm:accepted_records_total``    verified records committed by moving the ring pointer (accepted drafts
                                          plus the bonus token of each verify row)
* ``replayssm:rollbacks_total``           draft records rejected by verify (left behind the pointer): records,
                                          not rows
* ``replayssm:ring_occupancy``            gauge, 0..1: mean over the sequences holding a slot of committed records
                                          / window, at the last step

Counter names are given without ``_total``; Prometheus clients append it.
"""

from __future__ import annotations

# name (without _total for counters) -> help text
COUNTERS: dict[str, str] = {
    "replayssm:flushes": "Sequence steps that folded the record ring into the checkpoint.",
    "replayssm:nonflush_steps": "Sequence steps that only appended records (no state write).",
    "replayssm:state_bytes_read": "SSM state bytes read by ReplaySSM steps (from shapes).",
    "replayssm:state_bytes_written": "SSM state bytes written by ReplaySSM steps (from shapes).",
    "replayssm:conventional_state_bytes": "SSM state bytes a conventional engine would read + write for the same tokens.",
    "replayssm:accepted_records": "Verified records committed by moving the ring pointer (accepted drafts + bonus).",
    "replayssm:rollbacks": "Draft records rejected by verify (records, not rows).",
}
GAUGES: dict[str, str] = {
    "replayssm:ring_occupancy": "Mean committed records / window over the sequences holding a slot (0..1).",
}


def ring_occupancy(committed_records, window: int) -> float:
    """The gauge's value from the committed-record counts of the sequences holding a slot."""
    counts = [float(c) for c in committed_records]
    return sum(counts) / len(counts) / window if counts else 0.0
