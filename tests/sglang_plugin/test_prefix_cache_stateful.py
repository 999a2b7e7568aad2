"""Stateful test of the plugin pool under ``--mamba-radix-cache-strategy extra_buffer``: random interleavings of
prefill (insert), decode with track copies at boundaries, prefill with a tracked interior state, verify + commit,
radix match (copy-on-write out of a node), eviction and finish, on ``ReplayMambaPool`` (built through SGLang's
``HybridReqToTokenPool``), against a reference that recomputes every sequence's state from scratch (its
starting state and every token's inputs since, with the conventional recurrence in fp64).

A *node* is a track slot the radix tree holds (what SGLang donates at a boundary); a *live* slot is a running
request's. The pool's slot operations are the ones SGLang calls (``note_decode`` / ``note_track`` /
``settle``, ``flush_rows`` / ``after_prefill``, ``open_verify`` / ``commit_verify``, ``copy_from``,
``clear_slots``); the math is the PyTorch reference the plugin runs on CPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sglang_replayssm.reference import FAMILY_MODULES
from sglang_replayssm.sglang_plugin import options as plugin_options
from sglang_replayssm.flags import ReplaySSMOptions
from tests.reference.helpers import call, conventional, index_inputs, random_inputs, random_params, relerr

from .conftest import make_req_pool
import pytest

# every plugin step of these tests runs under the host-read guard (conftest.no_host_reads)
pytestmark = pytest.mark.usefixtures("no_host_reads")

SLOTS = 6
LAYERS = 2
TMAX = 3
WINDOW = 3


class Seq:
    """The reference of one slot: its state when its history starts, every token's inputs since, its conv."""

    def __init__(self, start: torch.Tensor, conv: list[torch.Tensor]):
        self.start, self.tokens, self.conv = start, [], conv   # tokens: per token, per layer, the inputs

    def copy(self) -> "Seq":
        c = Seq(self.start, [t.clone() for t in self.conv])
        c.tokens = list(self.tokens)
        return c

    def state(self, geo, params) -> torch.Tensor:
        """Recomputed from scratch: [layers, H, V, K] fp64."""
        out = []
        for layer in range(LAYERS):
            S = self.start[layer][None]
            for tok in self.tokens:
                _, S = conventional(geo, S, tok[layer], params)
            out.append(S[0])
        return torch.stack(out)


class PrefixCacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        plugin_options.set_active(ReplaySSMOptions(window=WINDOW))
        self.req_pool = make_req_pool("gdn", size=SLOTS, drafts=TMAX)
        self.pool = self.req_pool.mamba_pool
        assert self.pool.replay is not None
        self.geo = self.pool.geometry
        self.gen = torch.Generator().manual_seed(0)
        self.params = random_params(self.geo, torch.float64, self.gen)
        self.params32 = {k: v.float() for k, v in self.params.items()}
        self.fam = FAMILY_MODULES["gdn"]
        self.live: dict[int, Seq] = {}
        self.nodes: dict[int, Seq] = {}

    def teardown(self):
        plugin_options.set_active(None)

    # -------------------------------------------------------------- helpers
    def _free(self) -> list[int]:
        return [s for s in range(1, SLOTS + 1) if s not in self.live and s not in self.nodes]

    def _tokens(self, n: int, drafts: int | None = None) -> list[dict]:
        """Inputs of one step for ``n`` rows, one dict per layer (fp64: the reference's; the pool gets fp32)."""
        return [random_inputs(self.geo, n, torch.float64, drafts=drafts, gen=self.gen) for _ in range(LAYERS)]

    def _conv_of(self, slot: int) -> list[torch.Tensor]:
        return [c[:, slot].clone() for c in self.pool.mamba_cache.conv]

    def _scribble_conv(self, slots: list[int]) -> None:
        """What SGLang's conv kernel does to a row's conv state in a step (new values)."""
        for c in self.pool.mamba_cache.conv:
            for s in slots:
                c[:, s] = torch.randn(c[:, s].shape, generator=self.gen)
        for s in slots:
            self.live[s].conv = self._conv_of(s)

    def _decode_layer(self, rows: list[int], inp: dict, layer: int) -> None:
        f32 = {k: v.float() for k, v in inp.items()}
        got = call(self.fam.decode, self.geo, f32, self.params32, self.pool.replay, layer, torch.tensor(rows))
        want = torch.stack([conventional(self.geo, self.live[s].state(self.geo, self.params)[layer][None],
                                         index_inputs(inp, slice(b, b + 1)), self.params)[0][0]
                            for b, s in enumerate(rows)])
        assert relerr(got, want) < 1e-4

    # -------------------------------------------------------------- rules
    @precondition(lambda self: self._free())
    @rule(data=st.data())
    def prefill(self, data):
        """A new request's prefill (no cache hit): SGLang's kernel writes the final state into the checkpoint."""
        s = data.draw(st.sampled_from(self._free()))
        self.pool.clear_slots(torch.tensor([s]))
        start = torch.randn(LAYERS, *self.geo.state_shape, dtype=torch.float64, generator=self.gen) * 0.3
        self.pool.replay.ckpt[:, s] = start.float()
        for layer in range(LAYERS):
            self.pool.after_prefill(layer, torch.tensor([s]))
        self.live[s] = Seq(start.float().double(), [])
        self._scribble_conv([s])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data):
        """One decode step; some rows are at a track boundary: their state after the step goes to a track slot."""
        rows = sorted(data.draw(st.sets(st.sampled_from(sorted(self.live)), min_size=1)))
        spare = self._free() + sorted(self.nodes)   # ping-pong slots are reused: a node may be overwritten
        tracked = data.draw(st.lists(st.sampled_from(rows), unique=True, max_size=min(len(rows), len(spare))))
        dsts = data.draw(st.permutations(spare))[: len(tracked)] if tracked else []
        idx = torch.tensor(rows, dtype=torch.int32)
        self.pool.note_decode(idx)
        toks = self._tokens(len(rows))
        for layer in range(LAYERS):
            self._decode_layer(rows, toks[layer], layer)
        self._scribble_conv(rows)
        mask = torch.tensor([s in tracked for s in rows])
        dst = torch.tensor([dsts[tracked.index(s)] if s in tracked else -1 for s in rows])
        self.pool.note_track(idx, mask, dst, len(rows))
        self.pool.note_track(idx, ~mask, dst, len(rows))   # a later layer's note of the same step: ignored
        self.pool.settle()   # after ModelRunner.forward: cursor move, then the track copies
        for b, s in enumerate(rows):
            self.live[s].tokens.append([index_inputs(toks[layer], slice(b, b + 1)) for layer in range(LAYERS)])
        for s, d in zip(tracked, dsts):
            self.nodes[d] = self.live[s].copy()

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 4))
    def extend_with_track(self, data, n):
        """A continued prefill of ``n`` tokens (chunked prefill / a prompt after a cache hit), one row's state
        after ``k`` of them tracked into a free slot: the metadata hook folds the ring first, SGLang's kernel
        writes the final state into the live checkpoint and the tracked one into the track slot."""
        s = data.draw(st.sampled_from(sorted(self.live)))
        free = self._free()
        k = data.draw(st.integers(1, n))
        d = data.draw(st.sampled_from(free)) if free else None
        self.pool.flush_rows(torch.tensor([s]))
        assert int(self.pool.replay.cursor[s]) == 0
        toks = [self._tokens(1) for _ in range(n)]
        for layer in range(LAYERS):
            S = self.pool.replay.ckpt[layer, s][None].double()
            for i, tok in enumerate(toks):
                _, S = conventional(self.geo, S, tok[layer], self.params)
                if d is not None and i + 1 == k:
                    self.pool.replay.ckpt[layer, d] = S[0].float()
            self.pool.replay.ckpt[layer, s] = S[0].float()
            self.pool.after_prefill(layer, torch.tensor([s]))
            if d is not None:
                self.pool.after_prefill(layer, torch.tensor([d]))   # what track.track_mamba_state_extend does
        seq = self.live[s]
        for i, tok in enumerate(toks):
            seq.tokens.append([tok[layer] for layer in range(LAYERS)])
            if d is not None and i + 1 == k:
                self.nodes[d] = seq.copy()
                for c in self.pool.mamba_cache.conv:
                    c[:, d] = c[:, s]   # SGLang's extend track writes the conv state (its kernel), not ours

    @precondition(lambda self: self.live)
    @rule(data=st.data(), T=st.integers(1, TMAX))
    def verify_commit(self, data, T):
        rows = sorted(data.draw(st.sets(st.sampled_from(sorted(self.live)), min_size=1)))
        accepted = [data.draw(st.integers(0, T)) for _ in rows]
        idx = torch.tensor(rows)
        self.pool.open_verify(None)
        toks = self._tokens(len(rows), drafts=T)
        for layer in range(LAYERS):
            f32 = {k: v.float() for k, v in toks[layer].items()}
            out = call(self.fam.verify, self.geo, f32, self.params32, self.pool.replay, layer, idx)
            for b, s in enumerate(rows):
                S = self.live[s].state(self.geo, self.params)[layer][None]
                for i in range(T):
                    o, S = conventional(self.geo, S, index_inputs(toks[layer], (slice(b, b + 1), i)), self.params)
                    assert relerr(out[b, i], o[0]) < 1e-4
        self.pool.commit_verify(idx, torch.tensor(accepted), None, T)
        for b, s in enumerate(rows):
            for i in range(accepted[b]):
                self.live[s].tokens.append([index_inputs(toks[layer], (slice(b, b + 1), i)) for layer in range(LAYERS)])

    @precondition(lambda self: self.live)
    @rule(data=st.data(), T=st.integers(1, TMAX), tree=st.booleans())
    def verify_commit_track(self, data, T, tree):
        """A verify (chain, or an EAGLE-style tree) committed through SGLang's commit entry point with track
        slots (``extra_buffer``): a row whose accepted path crosses a track boundary at draft node ``n`` gets
        the state after the path up to ``n`` in its track slot (SSM state and conv window of ``n``), while its
        live slot commits the whole path (and folds when the window fills)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative import spec_utils

        rows = sorted(data.draw(st.sets(st.sampled_from(sorted(self.live)), min_size=1)))
        B = len(rows)
        parents = [-1] + [data.draw(st.integers(0, i - 1)) if tree else i - 1 for i in range(1, T)]
        paths = []
        for _ in rows:   # a root-to-node path, root (the bonus token's verify position) always accepted
            path = [0]
            while True:
                kids = [n for n in range(T) if parents[n] == path[-1]]
                if not kids or not data.draw(st.booleans()):
                    break
                path.append(data.draw(st.sampled_from(kids)))
            paths.append(path)
        spare = [s for s in self._free() + sorted(self.nodes)]
        tracked = data.draw(st.lists(st.sampled_from(range(B)), unique=True, max_size=min(B, len(spare))))
        dsts = dict(zip(tracked, data.draw(st.permutations(spare))[: len(tracked)]))
        cut = {b: data.draw(st.integers(1, len(paths[b]))) for b in tracked}   # nodes up to the boundary

        self.req_pool.req_index_to_mamba_index_mapping[torch.arange(B)] = torch.tensor(rows, dtype=torch.int32)
        self.pool.open_verify(torch.tensor([parents] * B, dtype=torch.int32) if tree else None)
        toks = self._tokens(B, drafts=T)
        for layer in range(LAYERS):
            f32 = {k: v.float() for k, v in toks[layer].items()}
            out = call(self.fam.verify, self.geo, f32, self.params32, self.pool.replay, layer, torch.tensor(rows),
                       parents=self.pool.verify_parents)
            for b, s in enumerate(rows):
                S0 = self.live[s].state(self.geo, self.params)[layer][None]
                node_state = {}
                for i in range(T):
                    o, node_state[i] = conventional(self.geo, S0 if parents[i] < 0 else node_state[parents[i]],
                                                    index_inputs(toks[layer], (slice(b, b + 1), i)), self.params)
                    assert relerr(out[b, i], o[0]) < 1e-4
        windows = self.pool.mamba_cache.intermediate_conv_window
        for w in windows:   # what SGLang's conv kernel writes in the verify: the conv state after each draft
            w[:, :B] = torch.randn(w[:, :B].shape, generator=self.gen)
        accept_index = torch.full((B, T), -1, dtype=torch.int64)
        for b, path in enumerate(paths):
            accept_index[b, : len(path)] = torch.tensor([b * T + n for n in path])
        steps = torch.tensor([paths[b][cut[b] - 1] if b in cut else -1 for b in range(B)])
        batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, req_pool_indices=torch.arange(B),
                                mamba_track_indices=torch.tensor([dsts.get(b, -1) for b in range(B)]))
        last = torch.tensor([p[-1] for p in paths])
        spec_utils.commit_mamba_states_after_verify(
            SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=self.req_pool)), batch,
            torch.tensor([len(p) for p in paths], dtype=torch.int32), accept_index, T,
            prepared_step_indices=(last, steps))

        def history(b, n):
            seq = self.live[rows[b]].copy()
            for node in paths[b][:n]:
                seq.tokens.append([index_inputs(toks[layer], (slice(b, b + 1), node)) for layer in range(LAYERS)])
            seq.conv = [w[:, b, paths[b][n - 1]].clone() for w in windows]
            return seq

        tracked_seqs = {dsts[b]: history(b, cut[b]) for b in tracked}
        for b, s in enumerate(rows):
            self.live[s] = history(b, len(paths[b]))
        self.nodes.update(tracked_seqs)

    @precondition(lambda self: self.nodes and self._free())
    @rule(data=st.data())
    def match(self, data):
        """A request hits a node: SGLang copies the node's state into the request's fresh slot (copy_from)."""
        node = data.draw(st.sampled_from(sorted(self.nodes)))
        dst = data.draw(st.sampled_from(self._free()))
        self.pool.copy_from(torch.tensor([node]), torch.tensor([dst]))
        self.live[dst] = self.nodes[node].copy()

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def evict(self, data):
        node = data.draw(st.sampled_from(sorted(self.nodes)))
        self.pool.clear_slots(torch.tensor([node]))
        del self.nodes[node]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        s = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.clear_slots(torch.tensor([s]))
        del self.live[s]

    @invariant()
    def every_slot_resumes_exactly(self):
        for s, seq in {**self.live, **self.nodes}.items():
            want = seq.state(self.geo, self.params)
            for layer in range(LAYERS):
                got = self.pool.materialize(layer, [s])[0]
                assert relerr(got, want[layer]) < 1e-4, (s, layer, relerr(got, want[layer]))
            for c, ref in zip(self.pool.mamba_cache.conv, seq.conv):
                assert torch.equal(c[:, s], ref), s


TestPrefixCacheGDN = PrefixCacheMachine.TestCase
TestPrefixCacheGDN.settings = settings(max_examples=12, stateful_step_count=18, deadline=None)
