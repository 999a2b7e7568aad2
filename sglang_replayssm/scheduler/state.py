"""Process-local routing state shared by the ingress and the Ray Serve request router.

Ray Serve runs a deployment handle's request router on its own event-loop thread inside the
caller's process (here: the ingress replica), and ships the router class by value. State the
router and the ingress both use therefore lives in this ordinary module: one `RouterState` per
process, guarded by a lock because two threads touch it.
"""

from __future__ import annotations

import threading
import time

from .policy import Choice, PolicyConfig
from .prefix_tree import PrefixTree

# how long a replica's reported stats count as current
STATS_TTL_S = 30.0
# how long a completion that arrived before its routing notice is remembered (see completed())
EARLY_COMPLETION_TTL_S = 300.0
EARLY_COMPLETION_MAX = 8192
# how long a request the policy placed counts on its replica before Serve's routing notice (see chose())
PENDING_TTL_S = 10.0


class RouterState:
    def __init__(self, cfg: PolicyConfig | None = None):
        self.lock = threading.Lock()
        self.configure(cfg or PolicyConfig())

    def configure(self, cfg: PolicyConfig) -> None:
        """(Re)start with `cfg`; a no-op when already configured with an equal config."""
        cfg.validate()
        if getattr(self, "cfg", None) == cfg:
            return
        with self.lock:
            self.cfg = cfg.validate()
            self.tree = PrefixTree(block_chars=cfg.block_chars)
            self.inflight: dict[str, int] = {}           # replica -> requests this router sent, not done
            self.open_requests: set = set()               # (serve internal request id, replica) counted in inflight
            self.pending: dict[str, tuple[str, float]] = {}  # serve internal request id -> (replica chosen, when)
            self.early_completions: dict[tuple[str, str], float] = {}  # completed before routed: time seen
            self.choices: dict[str, Choice] = {}          # route id -> last policy choice
            self.routed: dict[str, str] = {}              # route id -> replica it went to
            self.stats: dict[str, dict] = {}              # replica -> last reported stats
            self.stats_time: dict[str, float] = {}
            self.seen_replicas: list[str] = []            # first-seen order: the packing tie-break
            self.applied_prefix_reports: dict[str, int] = {}
            self.policy_loads: dict[str, int] = {}        # replica -> load the policy counted, last decision

    # -- load -------------------------------------------------------------------------------
    def loads(self, replicas) -> dict[str, int]:
        """{replica: requests on it}: those in flight there (routed, not completed) plus those the policy
        chose it for that Serve has not handed over yet (`chose`), so a burst of requests placed before
        the first of them is routed still fills replicas one request at a time.

        Every request to the engines passes this router (the ingress is one replica), so this count is
        exact. Serve's own queue-length cache is not used: it can stay a request or two high for its
        10 s lifetime after a burst (a completion counted down before an acceptance that still counted
        it), which made an idle replica look full. Engine-reported running/waiting arrive late (stats
        period + controller broadcast) and are used for metrics only, for the same reason."""
        now = time.monotonic()
        with self.lock:
            stale = [k for k, (_, t) in self.pending.items() if now - t >= PENDING_TTL_S]
            for k in stale:   # placed, then never routed (cancelled, or failed on every replica)
                del self.pending[k]
            out = {r: self.inflight.get(r, 0) for r in replicas}
            for r, _ in self.pending.values():
                if r in out:
                    out[r] += 1
        return out

    def chose(self, internal_id: str | None, replica: str) -> None:
        """The policy placed request `internal_id` first on `replica`; it counts there until Serve's
        routing notice (`routed_to`, wherever the request went) or PENDING_TTL_S. A request choosing
        again (Serve's backoff when every replica is full) replaces its earlier placement."""
        if internal_id:
            with self.lock:
                self.pending[internal_id] = (replica, time.monotonic())

    def note_loads(self, loads: dict[str, int]) -> None:
        """The loads a routing decision counted (exported as replayssm_router_replica_load)."""
        with self.lock:
            self.policy_loads.update(loads)

    def note_replica(self, replica: str) -> None:
        if replica not in self.seen_replicas:
            self.seen_replicas.append(replica)

    def forget_replicas_except(self, alive: set) -> None:
        """Drop state of replicas that left the deployment (dead or scaled down)."""
        with self.lock:
            gone = [r for r in self.seen_replicas if r not in alive]
            for r in gone:
                self.seen_replicas.remove(r)
                self.tree.remove_replica(r)
                self.stats.pop(r, None)
                self.stats_time.pop(r, None)
                self.inflight.pop(r, None)
                self.open_requests = {k for k in self.open_requests if k[1] != r}
                self.pending = {k: v for k, v in self.pending.items() if v[0] != r}
                self.applied_prefix_reports.pop(r, None)
                self.policy_loads.pop(r, None)

    def update_stats(self, replica: str, stats: dict) -> None:
        """Merge a replica's routing stats: load numbers and the prefixes its engine reports.

        `cached_prefix_blocks` ({"block_chars": n, "prefixes": [[hash, ...], ...]}: each prefix the
        engine holds state for, as the chained block hashes of its text, http_front/prefix_hash.block_hashes)
        is merged into the prefix tree when its block size is the tree's. Engines never report
        prompt text. `cached_prefixes` (the native engine's ids of token sequences) is only counted,
        in the metrics."""
        if not isinstance(stats, dict) or not stats:
            return
        with self.lock:
            self.stats[replica] = stats
            self.stats_time[replica] = time.monotonic()
            report = stats.get("cached_prefix_blocks")
            version = stats.get("seq", 0)
            if (isinstance(report, dict) and report.get("block_chars") == self.tree.block_chars
                    and isinstance(report.get("prefixes"), list)
                    and self.applied_prefix_reports.get(replica) != version):
                self.applied_prefix_reports[replica] = version
                for hashes in report["prefixes"]:
                    if isinstance(hashes, list) and all(isinstance(h, str) for h in hashes):
                        self.tree.insert_hashes(hashes, replica)

    # -- request lifecycle ---------------------------------------------------------------------
    def routed_to(self, route_id: str | None, internal_id: str | None, replica: str) -> None:
        with self.lock:
            if route_id:
                self.routed[route_id] = replica
            key = (internal_id, replica)
            if internal_id:
                self.pending.pop(internal_id, None)
            if internal_id and self.early_completions.pop(key, None) is not None:
                return  # it already finished (see completed()): nothing is in flight
            self.inflight[replica] = self.inflight.get(replica, 0) + 1
            if internal_id:
                self.open_requests.add(key)

    def completed(self, internal_id: str, replica: str) -> None:
        """Serve's completion notice for a request sent to `replica`.

        Serve registers the completion callback before it learns whether the replica accepted
        the request, so the notice can come (a) for an attempt the replica rejected, which was
        never routed here, and (b) before `routed_to` for a short request that finished while
        Serve awaited the acceptance. Both are remembered for a while; (b) then cancels its
        routing notice instead of leaving the replica's count one too high forever."""
        with self.lock:
            key = (internal_id, replica)
            if key in self.open_requests:
                self.open_requests.discard(key)
                if self.inflight.get(replica, 0) > 0:
                    self.inflight[replica] -= 1
                return
            now = time.monotonic()
            self.early_completions[key] = now
            if len(self.early_completions) > EARLY_COMPLETION_MAX:   # drop expired, then the oldest half
                kept = [(k, t) for k, t in self.early_completions.items() if now - t < EARLY_COMPLETION_TTL_S]
                self.early_completions = dict(kept[-EARLY_COMPLETION_MAX // 2:])

    def served(self, route_key: str, replica: str) -> None:
        """The replica processed this prompt (+ output): it now holds these prefixes."""
        if route_key:
            with self.lock:
                self.tree.insert(route_key, replica)

    def pop_route(self, route_id: str):
        with self.lock:
            return self.choices.pop(route_id, None), self.routed.pop(route_id, None)


STATE = RouterState()
