"""The routing policy, the prefix tree and the scheduler options, without Ray."""

import argparse
import random
import time

import pytest

from sglang_replayssm.scheduler.policy import LOAD_OVERRIDE, PACK, PREFIX_HIT, SPILL, PolicyConfig, choose
from sglang_replayssm.scheduler.prefix_tree import PrefixTree
from sglang_replayssm.scheduler.serve_app import SchedulerError, options_from_args

CFG = PolicyConfig(target_batch=4, imbalance_threshold=3, min_prefix_chars=8, block_chars=4)


def test_pack_fills_the_fullest_replica_below_target_first():
    c = choose({"a": 0, "b": 0, "c": 0}, {}, CFG, order=["a", "b", "c"])
    assert (c.ranked[0], c.decision) == ("a", PACK)
    c = choose({"a": 3, "b": 1, "c": 0}, {}, CFG, order=["a", "b", "c"])
    assert c.ranked == ["a", "b", "c"] and c.decision == PACK
    c = choose({"a": 4, "b": 1, "c": 0}, {}, CFG, order=["a", "b", "c"])  # a is at its target batch
    assert c.ranked[0] == "b" and c.ranked[-1] == "a"


def test_spill_to_least_loaded_when_all_at_target():
    c = choose({"a": 6, "b": 4, "c": 5}, {}, CFG, order=["a", "b", "c"])
    assert c.ranked == ["b", "c", "a"] and c.decision == SPILL


def test_spread_policy_is_least_loaded():
    cfg = PolicyConfig(policy="spread", target_batch=4)
    c = choose({"a": 3, "b": 1, "c": 2}, {}, cfg, order=["a", "b", "c"])
    assert c.ranked == ["b", "c", "a"] and c.decision == SPILL


def test_power_of_two_picks_the_lighter_of_two():
    cfg = PolicyConfig(policy="spread", spill="power_of_two")
    loads = {"a": 9, "b": 1, "c": 5, "d": 7}
    for seed in range(20):
        c = choose(loads, {}, cfg, rng=random.Random(seed))
        assert sorted(c.ranked) == sorted(loads)
        assert c.ranked[0] != "a"  # the most loaded one never wins a pair


def test_prefix_affinity_beats_packing_until_overloaded():
    loads = {"a": 1, "b": 0}
    c = choose(loads, {"b": 12}, CFG, order=["a", "b"])
    assert (c.ranked[0], c.decision, c.matched_chars) == ("b", PREFIX_HIT, 12)
    # below its target batch the affinity replica keeps the request, however skewed
    c = choose({"a": 0, "b": 3}, {"b": 12}, CFG, order=["a", "b"])
    assert (c.ranked[0], c.decision) == ("b", PREFIX_HIT)
    # at its target batch and >= threshold above the least loaded: override
    c = choose({"a": 0, "b": 4}, {"b": 12}, CFG, order=["a", "b"])
    assert (c.ranked, c.decision, c.affinity) == (["a", "b"], LOAD_OVERRIDE, "b")
    # at target but within the threshold of the others: affinity still wins
    c = choose({"a": 2, "b": 4}, {"b": 12}, CFG, order=["a", "b"])
    assert (c.ranked[0], c.decision) == ("b", PREFIX_HIT)


def test_short_matches_are_ignored_and_longest_match_wins():
    c = choose({"a": 0, "b": 0}, {"b": 4}, CFG, order=["a", "b"])
    assert c.decision == PACK and c.ranked[0] == "a"
    c = choose({"a": 0, "b": 0, "c": 0}, {"b": 8, "c": 16}, CFG, order=["a", "b", "c"])
    assert (c.ranked[0], c.matched_chars) == ("c", 16)


def test_bad_policy_config_names_the_flag():
    for kw, flag in (({"target_batch": 0}, "--route-target-batch"), ({"policy": "x"}, "--route-policy"),
                     ({"imbalance_threshold": 0}, "--route-imbalance-threshold"), ({"spill": "y"}, "--route-spill")):
        with pytest.raises(ValueError, match=flag):
            PolicyConfig(**kw).validate()


def test_prefix_tree_match_insert_remove_evict():
    t = PrefixTree(block_chars=4, max_nodes=50)
    t.insert("abcdefghijkl", "r1")
    t.insert("abcdefgh", "r2")
    assert t.match("abcdefghijklmnop") == {"r1": 12, "r2": 8}
    assert t.match("abcdXXXX") == {"r1": 4, "r2": 4}
    assert t.match("abcdefghijkl", replicas=["r2"]) == {"r2": 8}
    assert t.match("abc") == {}
    t.remove_replica("r1")
    assert t.match("abcdefghijkl") == {"r2": 8}
    assert t.replicas() == {"r2"}
    for i in range(100):
        t.insert(f"{i:04d}" * 3, "r3")
    assert len(t) <= 50


def _ns(**kw):
    base = dict(replicas=2, ray_address=None, host="127.0.0.1", port=8000, engine="native", engine_argv=[])
    base.update(kw)
    return argparse.Namespace(**base)


def test_options_take_scheduler_flags_out_of_the_engine_args():
    o = options_from_args(_ns(engine_argv=["--device", "cpu", "--route-target-batch", "7", "--replica-num-cpus",
                                           "0", "--route-policy", "spread"]))
    assert o.engine_argv == ["--device", "cpu"]
    assert (o.policy.target_batch, o.policy.policy, o.replica_num_cpus) == (7, "spread", 0.0)
    assert o.replica_num_gpus == 0.0
    assert options_from_args(_ns(engine="sglang")).replica_num_gpus == 1.0


@pytest.mark.parametrize("replicas", [0, -1, None, "2"])
def test_bad_replica_count_is_a_clear_error(replicas):
    with pytest.raises(SchedulerError, match="--replicas"):
        options_from_args(_ns(replicas=replicas))


def test_bad_route_flag_is_a_clear_error():
    with pytest.raises(SchedulerError, match="--route-target-batch"):
        options_from_args(_ns(engine_argv=["--route-target-batch", "0"]))


def test_router_state_inflight_counts_survive_any_callback_order():
    """Serve's completion notice can come before the routing notice (a short request finishing
    while Serve awaits the replica's acceptance) or without one (an attempt the replica rejected):
    the per-replica in-flight count must return to zero either way."""
    from sglang_replayssm.scheduler.state import RouterState

    st = RouterState(PolicyConfig())
    rng = random.Random(0)
    events = []
    for i in range(200):
        rid, rep = f"req{i}", rng.choice(["a", "b"])
        kind = rng.choice(["normal", "early", "rejected_then_routed"])
        if kind == "normal":
            events.append([("routed", rid, rep), ("done", rid, rep)])
        elif kind == "early":
            events.append([("done", rid, rep), ("routed", rid, rep)])
        else:
            other = "b" if rep == "a" else "a"
            events.append([("done", rid, other), ("routed", rid, rep), ("done", rid, rep)])
    # interleave the requests, keeping each request's own order
    queues = [list(e) for e in events]
    peak = 0
    while queues:
        q = rng.choice(queues)
        kind, rid, rep = q.pop(0)
        if kind == "routed":
            st.routed_to(None, rid, rep)
        else:
            st.completed(rid, rep)
        assert all(v >= 0 for v in st.inflight.values())
        peak = max(peak, sum(st.inflight.values()))
        if not q:
            queues.remove(q)
    assert peak > 0
    assert st.inflight == {"a": 0, "b": 0}
    assert not st.open_requests
    # the rejected attempts' notices stay remembered (bounded), the early ones were consumed
    assert all(k[0].startswith("req") for k in st.early_completions)
    st.routed_to(None, "late", "a")
    assert st.inflight["a"] == 1
    st.completed("late", "a")
    assert st.inflight["a"] == 0
    # completions never followed by a routing notice (rejected attempts) stay bounded
    from sglang_replayssm.scheduler.state import EARLY_COMPLETION_MAX
    for i in range(3 * EARLY_COMPLETION_MAX):
        st.completed(f"rejected{i}", "b")
    assert len(st.early_completions) <= EARLY_COMPLETION_MAX
    assert ("rejected%d" % (3 * EARLY_COMPLETION_MAX - 1), "b") in st.early_completions


def test_a_placed_request_counts_on_its_replica_until_serve_hands_it_over(monkeypatch):
    """A burst placed before any of it is routed fills replicas one request at a time; the placement
    moves to wherever Serve routed the request, and one never routed (cancelled, or rejected by every
    replica) stops counting after PENDING_TTL_S."""
    from sglang_replayssm.scheduler import state as state_mod

    st = state_mod.RouterState(PolicyConfig())
    for r in ("a", "b"):
        st.note_replica(r)
    cfg = PolicyConfig(target_batch=2)
    placed = []
    for i in range(4):   # four requests placed at once: none routed yet
        choice = choose(st.loads(["a", "b"]), {}, cfg, order=["a", "b"])
        st.chose(f"r{i}", choice.ranked[0])
        placed.append((choice.ranked[0], choice.decision))
    assert placed == [("a", PACK), ("a", PACK), ("b", PACK), ("b", PACK)]
    assert st.loads(["a", "b"]) == {"a": 2, "b": 2}
    assert choose(st.loads(["a", "b"]), {}, cfg, order=["a", "b"]).decision == SPILL
    st.routed_to(None, "r0", "a")
    st.routed_to(None, "r3", "a")                 # placed on b, Serve routed it to a
    assert st.loads(["a", "b"]) == {"a": 3, "b": 1} and st.inflight == {"a": 2}
    st.chose("r1", "b")                           # choosing again (Serve's backoff) moves the placement
    assert st.loads(["a", "b"]) == {"a": 2, "b": 2}
    st.completed("r0", "a")
    st.completed("r3", "a")
    assert st.loads(["a", "b"]) == {"a": 0, "b": 2}   # r1 and r2 placed on b, never routed
    now = time.monotonic()
    monkeypatch.setattr(state_mod.time, "monotonic", lambda: now + state_mod.PENDING_TTL_S)
    assert st.loads(["a", "b"]) == {"a": 0, "b": 0} and not st.pending
    st.chose("r4", "a")
    st.forget_replicas_except({"b"})              # a replica that left takes its placements with it
    assert st.loads(["a", "b"]) == {"a": 0, "b": 0}


def test_the_loads_a_decision_counted_are_exported_until_their_replica_leaves():
    from sglang_replayssm.scheduler.metrics import RouterMetrics
    from sglang_replayssm.scheduler.state import RouterState

    from .client import metric_values

    st = RouterState(PolicyConfig())
    metrics = RouterMetrics(st)
    for r in ("a", "b"):
        st.note_replica(r)
    assert metric_values(metrics.render().decode(), "replayssm_router_replica_load") == {}   # no decision yet
    st.note_loads({"a": 3, "b": 0})
    st.note_loads({"b": 1})          # a decision among a subset of the replicas keeps the others' last counts
    page = metrics.render().decode()
    assert metric_values(page, "replayssm_router_replica_load") == {'{replica="a"}': 3.0, '{replica="b"}': 1.0}
    st.forget_replicas_except({"b"})
    page = metrics.render().decode()
    assert metric_values(page, "replayssm_router_replica_load") == {'{replica="b"}': 1.0}


def test_default_target_batch_is_each_replicas_slot_count():
    """No --route-target-batch: a replica is packed up to its reported total_slots, then the next one
    fills (issue 17, item 16: with a fixed 32, all of a 40-request run went to one 8-slot replica)."""
    cfg = PolicyConfig()
    assert cfg.target_batch is None
    slots = {"a": 8, "b": 8}
    loads = {"a": 0, "b": 0}
    placed = []
    for _ in range(16):
        r = choose(loads, {}, cfg, order=["a", "b"], slots=slots).ranked[0]
        loads[r] += 1
        placed.append(r)
    assert placed == ["a"] * 8 + ["b"] * 8
    assert choose(loads, {}, cfg, order=["a", "b"], slots=slots).decision == SPILL   # both full
    # a replica that reports no slots gets DEFAULT_TARGET_BATCH; an explicit flag wins over slots
    assert choose({"a": 9, "b": 0}, {}, cfg, order=["a", "b"], slots={"b": 4}).ranked[0] == "a"
    assert choose({"a": 2, "b": 0}, {}, PolicyConfig(target_batch=2), order=["a", "b"], slots=slots).ranked[0] == "b"


def test_affinity_is_overridden_at_the_replicas_own_slot_count():
    cfg = PolicyConfig(imbalance_threshold=2, min_prefix_chars=8)
    c = choose({"a": 4, "b": 0}, {"a": 40}, cfg, order=["a", "b"], slots={"a": 4, "b": 4})
    assert (c.ranked[0], c.decision) == ("b", LOAD_OVERRIDE)
    c = choose({"a": 3, "b": 0}, {"a": 40}, cfg, order=["a", "b"], slots={"a": 4, "b": 4})
    assert (c.ranked[0], c.decision) == ("a", PREFIX_HIT)


def test_sglang_load_report_becomes_ours():
    from sglang_replayssm.scheduler.replica import sglang_load

    report = {"loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "max_running_requests": 8},
                        {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 0, "max_running_requests": 8}]}
    assert sglang_load(report) == {"running": 5, "waiting": 1, "total_slots": 16, "free_slots": 11}
    assert sglang_load({"loads": []}) == {"running": 0, "waiting": 0}
