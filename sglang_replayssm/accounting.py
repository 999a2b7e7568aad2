"""The ``replayssm:*`` Prometheus metrics and the SSM-state bytes each step kind moves: one definition for the
native engine (``native/metrics.py``, ``native/traffic.py``), the SGLang plugin (``sglang_plugin/metrics.py``,
``sglang_plugin/pool.py``) and the Grafana dashboard (``deploy/grafana``: each panel that draws a
``replayssm:`` metric carries ``panel_description`` of its metrics; tests/cpu_harness checks it).

State bytes, per SSM layer and sequence (sizes from the pool's own tensors, ``StateSizes``):

  step kind               reads                                   writes
  decode, non-flush row   read copy (or checkpoint) + c records   one record
  decode, flush row       checkpoint + c records                  one record + checkpoint (+ read copy)
  verify of T tokens      read copy (or checkpoint) + c records   T records
  ... its commit, folding checkpoint + n committed records        checkpoint (+ read copy)
  snapshot verify         the state                               T snapshots; commit: state (+ read copy)
  conventional step       the state                               the state

(c: records in the ring before the step; n: after the commit; a commit folds when n reaches the window.) A
conventional engine moves ``2 * state`` per token (``conventional_traffic``), at its own state precision.
Counter names are given without ``_total``; Prometheus clients append it.
"""

from __future__ import annotations

from dataclasses import dataclass

NATIVE, SGLANG = "native", "sglang"
BOTH = (NATIVE, SGLANG)


@dataclass(frozen=True)
class Metric:
    name: str                 # Prometheus name (a counter's without "_total")
    kind: str                 # "counter" | "gauge"
    unit: str                 # what one count is
    help: str                 # the HELP line
    meaning: str              # how it is counted, the same in every engine that exports it
    engines: tuple[str, ...] = BOTH

    @property
    def exported(self) -> str:
        """The name a scrape shows."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


METRICS: tuple[Metric, ...] = (
    Metric("replayssm:flushes", "counter", "sequence steps",
           "Sequence steps that folded the record ring into the checkpoint.",
           "decode rows whose record filled the window, and verify rows whose commit did (a snapshot verify "
           "row always counts here: it writes the state)"),
    Metric("replayssm:nonflush_steps", "counter", "sequence steps",
           "Sequence steps that only appended records (no state write).",
           "decode and verify rows that only appended records to the ring (no checkpoint write)"),
    Metric("replayssm:state_bytes_read", "counter", "bytes",
           "SSM state bytes read by ReplaySSM steps (from shapes).",
           "SSM state bytes the flush and non-flush steps read, from the pool's tensor shapes (accounting.py)"),
    Metric("replayssm:state_bytes_written", "counter", "bytes",
           "SSM state bytes written by ReplaySSM steps (from shapes).",
           "SSM state bytes the flush and non-flush steps wrote, from the pool's tensor shapes (accounting.py)"),
    Metric("replayssm:conventional_state_bytes", "counter", "bytes",
           "SSM state bytes a conventional engine would read + write for the same tokens.",
           "2 x the full SSM state per token those steps decoded or verified, at a conventional engine's "
           "state precision"),
    Metric("replayssm:accepted_records", "counter", "records",
           "Verified records committed by moving the ring pointer (accepted drafts + bonus).",
           "per verify row, the accepted draft tokens plus its bonus token"),
    Metric("replayssm:rollbacks", "counter", "records",
           "Draft records rejected by verify (records, not rows).",
           "per verify row, T verified tokens minus its accepted records: left behind the ring pointer"),
    Metric("replayssm:ring_occupancy", "gauge", "fraction",
           "Mean committed records / window over the sequences holding a slot (0..1).",
           "after the last decode or verify step, over its sequences: records committed and not yet folded "
           "/ window (0 right after a flush)"),
    Metric("replayssm:slot_bytes", "gauge", "bytes",
           "Device bytes of one sequence's SSM state slot (checkpoint, read copy, record ring, conv window).",
           "the pool's bytes per slot, every SSM layer, on this TP rank (its shard of the heads); times the slots "
           "in use over the running requests (sglang:mamba_used_tokens / sglang:num_running_reqs on SGLang) it is "
           "the SSM state a running request costs"),
    Metric("replayssm:running_request_bytes", "gauge", "bytes",
           "SSM state bytes this server reserves per running request (slot bytes x mamba slots per request).",
           "replayssm:slot_bytes times the mamba slots SGLang reserves per running request under this server's "
           "radix cache strategy (KVCacheConfigurator._calculate_mamba_ratio: 1 with the radix cache off; with it "
           "3, plus the track slots: extra_buffer_lazy 1, extra_buffer 2 with the overlap scheduler), on this TP rank; "
           "the mamba pool's bytes over it bound the running requests", (SGLANG,)),
    Metric("replayssm:stock_running_request_bytes", "gauge", "bytes",
           "SSM state bytes stock SGLang reserves per running request for this model (extra_buffer, overlap on).",
           "SGLang's own slot (its conv and SSM state at --mamba-ssm-dtype) times its slots per running request "
           "under extra_buffer with the overlap scheduler (its GPU default with the radix cache; 1 slot with the "
           "radix cache off), on this TP rank", (SGLANG,)),
    Metric("replayssm:sglang_replayssm_running_request_bytes", "gauge", "bytes",
           "SSM state bytes SGLang's --enable-linear-replayssm reserves per running request (no_buffer).",
           "SGLang's own slot times its slots per running request under no_buffer (the strategy its ReplaySSM "
           "forces with the radix cache; 1 slot with the radix cache off), plus its record ring (per slot for KDA, "
           "per request for GDN), on this TP rank; 0 for Mamba-2 (no ReplaySSM decode in SGLang)", (SGLANG,)),
    Metric("replayssm:draft_tokens", "counter", "tokens", "Speculative draft tokens proposed",
           "draft tokens the native engine's drafter proposed for verify", (NATIVE,)),
    Metric("replayssm:accepted_draft_tokens", "counter", "tokens", "Speculative draft tokens accepted",
           "draft tokens verify accepted (bonus tokens not counted)", (NATIVE,)),
    Metric("replayssm:prefix_cache_hits", "counter", "requests", "Requests started from a cached prompt-prefix state",
           "requests whose prefill started from the native engine's prompt-prefix cache", (NATIVE,)),
    Metric("replayssm:prefix_cache_hit_tokens", "counter", "tokens", "Prompt tokens not prefilled thanks to the cache",
           "prompt tokens those requests did not prefill", (NATIVE,)),
    Metric("replayssm:pool_usage", "gauge", "fraction", "Fraction of ReplayStatePool slots in use",
           "slots held by requests / slots", (NATIVE,)),
    Metric("replayssm:pool_slots_total", "gauge", "slots", "ReplayStatePool slots",
           "the pool's slots (max running requests)", (NATIVE,)),
    Metric("replayssm:pool_slots_free", "gauge", "slots", "Free ReplayStatePool slots",
           "slots no request holds", (NATIVE,)),
    Metric("replayssm:batch_size", "gauge", "rows", "Rows in the last decode/verify step",
           "sequences in the native engine's last decode or verify step", (NATIVE,)),
)
BY_NAME = {m.name: m for m in METRICS}
# name -> help of the metrics both engines export (the SGLang plugin exports exactly these)
COUNTERS = {m.name: m.help for m in METRICS if m.kind == "counter" and m.engines == BOTH}
GAUGES = {m.name: m.help for m in METRICS if m.kind == "gauge" and m.engines == BOTH}
# the gauges only the SGLang plugin exports (what SGLang's scheduler reserves per running request)
SGLANG_GAUGES = {m.name: m.help for m in METRICS if m.kind == "gauge" and m.engines == (SGLANG,)}


def panel_description(names) -> str:
    """A Grafana panel's description: one line per ``replayssm:`` metric it draws (exported names)."""
    by_exported = {m.exported: m for m in METRICS}
    lines = []
    for n in names:
        m = by_exported[n]
        only = "" if m.engines == BOTH else f", {' and '.join(m.engines)} engine only"
        lines.append(f"{n} ({m.unit}{only}): {m.meaning}.")
    return "\n".join(lines)


def ring_occupancy(committed_records, window: int) -> float:
    """The gauge's value from the committed-record counts of the sequences of the last step."""
    counts = [float(c) for c in committed_records]
    return sum(counts) / len(counts) / window if counts else 0.0


# ---------------------------------------------------------------------------------------------- state bytes
@dataclass(frozen=True)
class StateSizes:
    ckpt: int                # bytes of one layer's checkpoint of one sequence
    read: int                # bytes a non-flush step reads for the state (read copy or checkpoint)
    rc: int                  # bytes of the read copy (0 without)
    record: int              # bytes of one record as a step writes it (d, k, g; a delta family's raw v and beta too)
    record_read: int         # bytes of one record as a step reads it (d, k, g; a delta family's fold reads v and
                             # beta in place of d, counted the same)
    conventional_state: int  # bytes of a conventional engine's state of one layer and sequence
    layers: int

    @classmethod
    def of(cls, pool, conventional_itemsize: int = 4) -> StateSizes:
        """Sizes of a ``ReplayStatePool``; the conventional engine keeps its state at ``conventional_itemsize``
        bytes per element (fp32 unless told)."""
        per = lambda t: 0 if t is None else t[0, 0].numel() * t.element_size()  # noqa: E731
        rc = per(pool.rc) + per(pool.rc_scale) + per(pool.rc_gscale)
        one = lambda ts: sum(t[0, 0, 0].numel() * t.element_size() for t in ts if t is not None)  # noqa: E731
        rec = read = 0
        if pool.rec_d is not None:
            read = one((pool.rec_d, pool.rec_k, pool.rec_g))
            rec = read + one((getattr(pool, "rec_v", None), getattr(pool, "rec_beta", None)))
        H, Dv, Dk = pool.geo.state_shape
        ckpt = per(pool.ckpt)
        return cls(ckpt=ckpt, read=rc or ckpt, rc=rc, record=rec, record_read=read,
                   conventional_state=H * Dv * Dk * conventional_itemsize, layers=pool.num_layers)


def decode_traffic(s: StateSizes, rows, flushes, records_read, conventional: bool = False) -> tuple:
    """(read, written) bytes, all layers, of ``rows`` decode rows of which ``flushes`` flush, whose rings held
    ``records_read`` records in all. ``conventional``: the pool keeps full states (no ring)."""
    if conventional:
        return s.layers * rows * s.ckpt, s.layers * rows * s.ckpt
    nonflush = rows - flushes
    read = s.layers * (nonflush * s.read + flushes * s.ckpt + records_read * s.record_read)
    return read, s.layers * (rows * s.record + flushes * (s.ckpt + s.rc))


def verify_traffic(s: StateSizes, mode: str, rows, tokens, records_read, folds, fold_records) -> tuple:
    """(read, written) of verifying ``tokens`` tokens over ``rows`` rows (rings holding ``records_read``
    records) and committing them, ``folds`` rows folding ``fold_records`` committed records; mode 'replay' |
    'snapshot' (reads the state, writes one snapshot per token, the commit copies one back)."""
    if mode == "replay":
        read = s.layers * (rows * s.read + records_read * s.record_read + folds * s.ckpt + fold_records * s.record_read)
        return read, s.layers * (tokens * s.record + folds * (s.ckpt + s.rc))
    return s.layers * 2 * rows * s.ckpt, s.layers * (tokens * s.ckpt + rows * (s.ckpt + s.rc))


def conventional_traffic(s: StateSizes, tokens) -> int:
    """Bytes a conventional engine reads + writes for ``tokens`` tokens, all layers."""
    return 2 * s.layers * s.conventional_state * tokens


def decode_bytes(s: StateSizes, conventional: bool, cursor: int, flush: bool) -> tuple[int, int]:
    """(read, written) of one decode row whose ring held ``cursor`` records."""
    return decode_traffic(s, 1, int(flush), cursor, conventional)
