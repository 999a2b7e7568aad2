"""Ray Serve RequestRouter applying the ReplaySSM routing policy (see policy.py).

Configured on the engine deployment as
`RequestRouterConfig(request_router_class="sglang_replayssm.scheduler.request_router:ReplaySSMRouter")`
and instantiated by Serve inside the process holding the deployment handle (the ingress). The
request payload (a dict, first positional argument) carries `route_key` (prompt text used for
prefix matching), `route_id` (to report the decision back) and `exclude` (replicas that already
failed this request). State shared with the ingress lives in state.STATE.

Serve traps handled here: an exception escaping choose_replicas hangs the request (so everything is
caught and the fallback returns every candidate); `should_backoff` is set so that a round in which
every replica is at max_ongoing_requests sleeps instead of spinning; no FIFOMixin (it would hand a
chosen replica to a different request and break affinity).
"""

from __future__ import annotations

import logging

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from sglang_replayssm.scheduler import policy as _policy
from sglang_replayssm.scheduler import state as _state

logger = logging.getLogger("ray.serve")


class ReplaySSMRouter(RequestRouter):
    def initialize_state(self, **kwargs):
        cfg = _policy.PolicyConfig(**kwargs)
        _state.STATE.configure(cfg)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        try:
            return self._rank(candidate_replicas, pending_request)
        except Exception:  # never let an exception escape: Serve would hang the request
            logger.exception("ReplaySSMRouter: policy failed, falling back to any replica")
            return [list(candidate_replicas)]

    def _rank(self, candidates, pending_request):
        st = _state.STATE
        payload = {}
        if pending_request is not None and pending_request.args:
            first = pending_request.args[0]
            if isinstance(first, dict):
                payload = first
        exclude = set(payload.get("exclude") or ())
        usable = [r for r in candidates if r.replica_id.unique_id not in exclude] or list(candidates)
        by_id = {}
        slots = {}
        for r in usable:
            uid = r.replica_id.unique_id
            by_id[uid] = r
            st.note_replica(uid)
            stats = r.routing_stats
            if stats:
                st.update_stats(uid, stats)
                slots[uid] = stats.get("total_slots")
        loads = st.loads(by_id)
        st.note_loads(loads)
        key = payload.get("route_key") or ""
        with st.lock:
            matches = st.tree.match(key, by_id.keys()) if key else {}
        choice = _policy.choose(loads, matches, st.cfg, order=st.seen_replicas, slots=slots)
        route_id = payload.get("route_id")
        if route_id:
            st.choices[route_id] = choice
        if pending_request is not None and choice.ranked:
            st.chose(pending_request.metadata.internal_request_id, choice.ranked[0])
        return [[by_id[uid]] for uid in choice.ranked]

    def update_replicas(self, replicas: list[RunningReplica]):
        super().update_replicas(replicas)
        alive = {r.replica_id.unique_id for r in replicas}
        for r in replicas:  # called on every controller broadcast, routing stats included
            uid = r.replica_id.unique_id
            _state.STATE.note_replica(uid)
            if r.routing_stats:
                _state.STATE.update_stats(uid, r.routing_stats)
        _state.STATE.forget_replicas_except(alive)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        alive = {rid.unique_id for rid in self._replicas}
        _state.STATE.forget_replicas_except(alive)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result):
        payload = pending_request.args[0] if pending_request.args else None
        route_id = payload.get("route_id") if isinstance(payload, dict) else None
        _state.STATE.routed_to(route_id, pending_request.metadata.internal_request_id,
                               replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str):
        _state.STATE.completed(internal_request_id, replica_id.unique_id)
