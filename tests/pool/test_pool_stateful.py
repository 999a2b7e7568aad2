"""Stateful property test: random alloc / step / verify / commit / flush / fork / free sequences on a
ReplayStatePool against an independent per-sequence conventional oracle."""

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sglang_replayssm.pool import PoolExhaustedError, ReplayConfig, ReplayStatePool, SSMGeometry
from sglang_replayssm.reference import FAMILY_MODULES
from tests.reference.helpers import call, conventional, index_inputs, random_inputs, random_params, relerr

NUM_SLOTS = 4
TMAX = 3


class PoolMachine(RuleBasedStateMachine):
    family = "gdn"

    def __init__(self):
        super().__init__()
        self.geo = SSMGeometry(self.family, 2, 4, 8, 1, conv_dim=3, conv_kernel=3)
        self.gen = torch.Generator().manual_seed(0)
        self.params = random_params(self.geo, torch.float64, self.gen)
        self.fam = FAMILY_MODULES[self.family]
        self.pool = ReplayStatePool(self.geo, 2, NUM_SLOTS,
                                    ReplayConfig(window=3, max_drafts=TMAX, ckpt="fp64", record_dtype=torch.float64))
        self.oracle: dict[int, torch.Tensor] = {}     # slot -> conventional state [layers, H, V, K]

    def _inputs(self, n, drafts=None):
        return random_inputs(self.geo, n, drafts=drafts, gen=self.gen)

    @rule(n=st.integers(1, 3))
    def alloc(self, n):
        if n > self.pool.num_free:
            try:
                self.pool.alloc(n)
            except PoolExhaustedError:
                return
            raise AssertionError("alloc beyond capacity did not raise")
        for s in self.pool.alloc(n):
            assert s != 0 and s not in self.oracle
            self.oracle[s] = torch.zeros(2, *self.geo.state_shape, dtype=torch.float64)

    @precondition(lambda self: self.oracle)
    @rule(data=st.data())
    def decode_step(self, data):
        rows = sorted(data.draw(st.sets(st.sampled_from(sorted(self.oracle)), min_size=1)))
        idx = torch.tensor(rows)
        for layer in range(2):
            inp = self._inputs(len(rows))
            want, new = conventional(self.geo, torch.stack([self.oracle[s][layer] for s in rows]), inp, self.params)
            got = call(self.fam.decode, self.geo, inp, self.params, self.pool, layer, idx)
            assert relerr(got, want) < 1e-10
            for i, s in enumerate(rows):
                self.oracle[s][layer] = new[i]
        self.pool.advance(idx)

    @precondition(lambda self: self.oracle)
    @rule(data=st.data(), T=st.integers(1, TMAX))
    def verify_commit(self, data, T):
        rows = sorted(data.draw(st.sets(st.sampled_from(sorted(self.oracle)), min_size=1)))
        accepted = [data.draw(st.integers(0, T)) for _ in rows]
        idx = torch.tensor(rows)
        self.pool.begin_verify(rows, T)
        for layer in range(2):
            inp = self._inputs(len(rows), drafts=T)
            out = call(self.fam.verify, self.geo, inp, self.params, self.pool, layer, idx)
            for b, s in enumerate(rows):
                S = self.oracle[s][layer][None]
                for i in range(T):
                    o, S = conventional(self.geo, S, index_inputs(inp, (slice(b, b + 1), i)), self.params)
                    assert relerr(out[b, i], o[0]) < 1e-10
                    if i + 1 == accepted[b]:
                        self.oracle[s][layer] = S[0]
        self.pool.accept_drafts(rows, accepted)

    @precondition(lambda self: self.oracle)
    @rule(data=st.data())
    def flush(self, data):
        s = data.draw(st.sampled_from(sorted(self.oracle)))
        self.pool.force_flush([s])
        assert int(self.pool.cursor[s]) == 0

    @precondition(lambda self: self.oracle and self.pool.num_free)
    @rule(data=st.data())
    def fork(self, data):
        src = data.draw(st.sampled_from(sorted(self.oracle)))
        dst = self.pool.alloc(1)[0]
        self.pool.fork(src, dst)
        self.oracle[dst] = self.oracle[src].clone()

    @precondition(lambda self: self.oracle)
    @rule(data=st.data())
    def free(self, data):
        s = data.draw(st.sampled_from(sorted(self.oracle)))
        self.pool.free([s])
        del self.oracle[s]

    @invariant()
    def every_slot_matches_its_oracle(self):
        for layer in range(2):
            for s, want in self.oracle.items():
                assert relerr(self.pool.materialize(layer, [s])[0], want[layer]) < 1e-10, (s, layer)
        assert self.pool.num_free + len(self.oracle) == NUM_SLOTS


class MambaPoolMachine(PoolMachine):
    family = "mamba2"


class KdaPoolMachine(PoolMachine):
    family = "kda"


_settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestPoolGDN = PoolMachine.TestCase
TestPoolGDN.settings = _settings
TestPoolMamba2 = MambaPoolMachine.TestCase
TestPoolMamba2.settings = _settings
TestPoolKDA = KdaPoolMachine.TestCase
TestPoolKDA.settings = _settings
