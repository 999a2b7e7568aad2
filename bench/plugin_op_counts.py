"""Eager device ops per step of the SGLang plugin, counted on CPU: every aten op that would launch a device kernel
(views, allocations and metadata ops excluded) and every Triton launch, per plugin entry point, for a decode step,
a prefill step, a chain verify and a tree verify (with and without ``extra_buffer`` track slots), GDN and Mamba-2.

Outside SGLang's CUDA graphs (a verify, a prefill, a batch larger than the graphs) each such op is one launch on the
host's critical path, and at concurrency 1 the host's launches are the step; inside a graph the per-layer hooks cost
nothing at replay, but the per-step entry points (metadata hook, settle, commit) always run eagerly.

The steps run through SGLang's real backend classes on tiny CPU tensors (the setup of tests/sglang_plugin), with the
pool's Triton kernels (what runs on a GPU) under TRITON_INTERPRET=1. Each entry point is counted apart: the metadata
hook (``backends.note_step``: decode rows, prefill flush, verify open), each layer's decode / verify / after-prefill
hook, ``settle`` and the commit (``spec_utils.commit_mamba_states_after_verify``, SGLang's index lookups and its
conv-state rollback included; that rollback counts one launch, its fused kernel on CUDA).
A step's ops are ``per_step + layers x per_layer``; ``per_layer`` is a later layer's count (the first layer also
converts the step's slot indices, counted in ``per_step``). Ops that read a device value back to the host are listed
apart (``host_reads``; none is expected).

    python bench/plugin_op_counts.py [--families gdn mamba2] [--out PATH]

tests/sglang_plugin/test_op_counts.py holds upper bounds on these counts.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton is imported: the kernels run (and are counted) on CPU

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# aten ops that launch no device kernel: allocations and metadata (views are found by their schema)
NO_LAUNCH = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "set_", "resize_",
             "_has_compatible_shallow_copy_type", "is_same_size", "sym_size", "sym_stride", "sym_numel",
             "sym_storage_offset", "is_nonzero", "result_type"}
HOST_READS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2", "equal"}
# SGLang's conv-state rollback at a commit (HybridLinearAttnBackend._scatter_speculative_state_with_mask) is one fused
# Triton launch on CUDA (fused_mamba_state_scatter_with_mask) and a chain of torch ops on CPU: counted as one launch
SGLANG_SCATTER = "sglang:fused_mamba_state_scatter_with_mask"
WINDOW = 4
SLOTS = [2, 3]
LAYERS = (0, 2)


class OpCounter(TorchDispatchMode):
    """Counts the launching aten ops dispatched inside it (``ops``: name -> count) and the Triton launches (marked by
    ``triton_launch``, whose own host-side tensor traffic under the interpreter is not counted)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.host_reads: collections.Counter = collections.Counter()
        self._in_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._in_triton:
            name = func.overloadpacket.__name__
            if name in HOST_READS:
                self.host_reads[name] += 1
            elif name not in NO_LAUNCH and not func.is_view:
                self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def triton_launch(self, name: str):
        self.ops["triton:" + name] += 1
        self._in_triton += 1
        try:
            yield
        finally:
            self._in_triton -= 1


class Recorder:
    """Counts per entry point: ``with rec.entry(name):`` counts what runs inside into ``rec.calls`` (a list of
    (name, ops, host reads), in call order); nothing is counted outside an entry."""

    def __init__(self):
        self.calls: list[tuple[str, collections.Counter, collections.Counter]] = []
        self.counter: OpCounter | None = None

    @contextlib.contextmanager
    def entry(self, name: str):
        if self.counter is not None:   # an entry inside another counts there
            yield
            return
        self.counter = OpCounter()
        try:
            with self.counter:
                yield
        finally:
            self.calls.append((name, self.counter.ops, self.counter.host_reads))
            self.counter = None

    def installed(self):
        """Triton launches counted once each; the metadata hook (``backends.note_step``) counted as an entry."""
        def counted(name, original, *args, **kwargs):
            if self.counter is None:
                return original(*args, **kwargs)
            with self.counter.triton_launch(name):
                return original(*args, **kwargs)

        return patched_entry_points(
            self, lambda run, fn_self, *a, **k: counted(fn_self.fn.__name__, run, fn_self, *a, **k),
            lambda scatter, *a, **k: counted(SGLANG_SCATTER, scatter, *a, **k))

    def take(self):
        calls, self.calls = self.calls, []
        return calls


@contextlib.contextmanager
def patched_entry_points(rec, launch, scatter):
    """While inside: Triton's interpreted launches go through ``launch(original_run, fn_self, *args, **kwargs)``,
    SGLang's conv-state rollback at a commit through ``scatter(original, *args, **kwargs)``, and the metadata hook
    (``backends.note_step``) runs as ``rec``'s entry "note_step"."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend as Hybrid
    from triton.runtime.interpreter import InterpretedFunction

    from sglang_replayssm.sglang_plugin import backends

    run, note_step = InterpretedFunction.run, backends.note_step
    original_scatter = Hybrid.__dict__["_scatter_speculative_state_with_mask"]

    def entry_note_step(backend, forward_batch):
        with rec.entry("note_step"):
            return note_step(backend, forward_batch)

    InterpretedFunction.run = lambda fn_self, *a, **k: launch(run, fn_self, *a, **k)
    backends.note_step = entry_note_step
    Hybrid._scatter_speculative_state_with_mask = staticmethod(
        lambda *a, **k: scatter(original_scatter.__func__, *a, **k))
    try:
        yield rec
    finally:
        InterpretedFunction.run, backends.note_step = run, note_step
        Hybrid._scatter_speculative_state_with_mask = original_scatter


def summarize(calls, layers: int) -> dict:
    """One step's calls -> per-step constant ops, per-layer ops (a later layer's), the total, and the ops by name."""
    layer_calls = [ops for name, ops, _ in calls if name == "layer"]
    assert len(layer_calls) == layers, (len(layer_calls), layers)
    per_layer = sum(layer_calls[-1].values())
    total = sum(sum(ops.values()) for _, ops, _ in calls)
    by_entry = collections.defaultdict(collections.Counter)
    for name, ops, _ in calls:
        by_entry[name].update(ops)
    return {"per_step": total - layers * per_layer, "per_layer": per_layer, "total": total, "layers": layers,
            "host_reads": sum(sum(h.values()) for _, _, h in calls),
            "by_entry": {name: {"ops": sum(c.values()) if name != "layer" else per_layer,
                                "by_op": dict(sorted((layer_calls[-1] if name == "layer" else c).items()))}
                         for name, c in by_entry.items()}}


# ----------------------------------------------------------------------------- the steps, as SGLang drives them


def _m2_inputs(B, T=None):
    """MambaMixer2's decode inputs: x, B, C split out of one conv output, dt a slice of the projection (views,
    as the mixer hands them)."""
    from tests.sglang_plugin.conftest import M2

    H, P, N, G = M2["H"], M2["P"], M2["N"], M2["G"]
    lead = (B,) if T is None else (B, T)
    xbc = torch.randn(*lead, H * P + 2 * G * N)
    x, b, c = torch.split(xbc, [H * P, G * N, G * N], dim=-1)
    dt = torch.randn(*lead, 2 * H)[..., :H] * 0.5
    return x.reshape(*lead, H, P), dt, b.reshape(*lead, G, N), c.reshape(*lead, G, N)


def _m2_layer(req_pool, layer_id, idx, B, T=None):
    from tests.sglang_plugin.conftest import M2
    from tests.sglang_plugin.test_backends import _m2_call

    H, P = M2["H"], M2["P"]
    x, dt, Bm, Cm = _m2_inputs(B, T)
    # MambaMixer2's parameters: A and D fp32, dt_bias in the model's dtype (bf16 on a GPU)
    A, D, dt_bias = -torch.ones(H), torch.ones(H), torch.zeros(H, dtype=torch.bfloat16)
    out = torch.empty(B, H, P) if T is None else torch.empty(B, T, H, P)
    return lambda: _m2_call(req_pool.mamba2_layer_cache(layer_id), idx, x, dt, Bm, Cm, A, D, dt_bias, out)


def _gdn_layer(req_pool, be, layer_id, idx, B, T=None):
    """GDNAttnBackend's calls: ``packed_decode`` of the conv output at decode, ``target_verify`` of q, k, v split
    out of it at verify."""
    from tests.sglang_plugin.conftest import GDN

    Hk, H, K, V = GDN["Hk"], GDN["H"], GDN["K"], GDN["V"]
    disp, cache = be.kernel_dispatcher, req_pool.mamba2_layer_cache(layer_id)
    n = B if T is None else B * T
    mixed = torch.randn(n, 2 * Hk * K + H * V)
    a, b = torch.randn(n, H), torch.randn(n, H)
    A_log, dt_bias = torch.zeros(H), torch.zeros(H)
    if T is None:
        return lambda: disp.packed_decode(mixed, a, b, A_log=A_log, dt_bias=dt_bias, scale=K ** -0.5,
                                          ssm_states=cache.temporal, cache_indices=idx, num_v_heads=H, head_v_dim=V)
    q, k, v = torch.split(mixed, [Hk * K, Hk * K, H * V], dim=-1)
    q, k, v = q.view(1, n, Hk, K), k.view(1, n, Hk, K), v.view(1, n, H, V)
    return lambda: disp.target_verify(A_log, dt_bias, q, k, v, a, b, ssm_states=cache.temporal, cache_indices=idx,
                                      query_start_loc=None, intermediate_states_buffer=None,
                                      intermediate_state_indices=None, cache_steps=T, retrieve_parent_token=None)


class Harness:
    """One family's request pool and SGLang backend (speculative: T drafts, tree when topk > 1)."""

    def __init__(self, family: str, rec: Recorder, T: int, topk: int, stack: contextlib.ExitStack):
        from tests.sglang_plugin.conftest import fake_runner, make_req_pool, replayssm, sglang_context

        self.family, self.rec, self.T = family, rec, T
        stack.enter_context(replayssm(window=WINDOW))
        sa = stack.enter_context(sglang_context(speculative_num_draft_tokens=T, speculative_eagle_topk=topk,
                                                mamba_track_interval=64))
        self.req_pool = make_req_pool(family, size=6, drafts=T, layers=LAYERS)
        self.pool = self.req_pool.mamba_pool
        if family == "gdn":
            from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend as cls
        else:
            from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend as cls
        self.be = cls(fake_runner(sa, self.req_pool))

    def _layers(self, T=None):
        idx = self.be.forward_metadata.mamba_cache_indices
        B = len(SLOTS)
        for layer_id in LAYERS:
            call = (_gdn_layer(self.req_pool, self.be, layer_id, idx, B, T) if self.family == "gdn"
                    else _m2_layer(self.req_pool, layer_id, idx, B, T))
            with self.rec.entry("layer"):
                call()

    def decode(self):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from tests.sglang_plugin.test_backends import _batch

        self.be.init_forward_metadata(_batch(ForwardMode.DECODE, SLOTS, self.req_pool))
        self._layers()
        with self.rec.entry("settle"):
            self.pool.settle()   # the ModelRunner.forward hook's call

    def prefill(self):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from tests.sglang_plugin.test_backends import _batch

        from sglang_replayssm.sglang_plugin.backends import _after_extend

        fb = _batch(ForwardMode.EXTEND, SLOTS, self.req_pool)
        fb.extend_seq_lens = torch.tensor([1, 1], dtype=torch.int32)
        fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = [1, 1], [7, 7]
        fb.extend_prefix_lens = torch.tensor([7, 7], dtype=torch.int32)
        fb.extend_start_loc = torch.tensor([0, 1], dtype=torch.int32)
        fb.extend_num_tokens = 2
        self.be.init_forward_metadata(fb)
        for layer_id in LAYERS:   # the extend hooks' call after SGLang's chunked kernels wrote the final states
            with self.rec.entry("layer"):
                _after_extend(self.be, layer_id, fb)

    def verify(self, paths, parents=None, track=None):
        """A target verify of T drafts (``parents``: the tree, None: a chain) and its commit of ``paths``
        (``track``: extra_buffer track slots of the rows, row 0 crossing a track boundary)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative import spec_utils
        from tests.sglang_plugin.test_backends import _batch

        T, B = self.T, len(SLOTS)
        nxt = sib = None
        if parents is not None:   # SGLang's first-child / next-sibling arrays of the tree
            nxt, sib = torch.full((B, T), -1), torch.full((B, T), -1)
            last_child = {}
            for n, p in enumerate(parents):
                if p >= 0:
                    if p in last_child:
                        sib[:, last_child[p]] = n
                    else:
                        nxt[:, p] = n
                    last_child[p] = n
        spec = SimpleNamespace(draft_token_num=T, ragged_verify_layout=None, retrieve_next_token=nxt,
                               retrieve_next_sibling=sib)
        self.be.init_forward_metadata(_batch(ForwardMode.TARGET_VERIFY, SLOTS, self.req_pool, spec, T))
        self._layers(T)
        with self.rec.entry("settle"):
            self.pool.settle()
        accept_lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
        accept_index = torch.full((B, T), -1, dtype=torch.int64)
        for b, p in enumerate(paths):
            accept_index[b, : len(p)] = torch.tensor([b * T + n for n in p])
        batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, req_pool_indices=torch.arange(B, dtype=torch.int32))
        if track is not None:
            batch.mamba_track_indices = torch.tensor(track)
            batch.seq_lens = torch.tensor([62, 10])
            batch.tree_cache = SimpleNamespace(page_size=1)
        worker = SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=self.req_pool))
        with self.rec.entry("commit"):
            spec_utils.commit_mamba_states_after_verify(worker, batch, accept_lens, accept_index, T)


STEPS = ("decode", "prefill", "verify_chain", "verify_tree", "verify_tree_track")
DRAFTS = 4
TREE = [-1, 0, 0, 2]                      # node 0 the root, 1 and 2 its children, 3 a child of 2
TREE_PATHS, CHAIN_PATHS = [[0, 2, 3], [0, 1]], [[0, 1], [0, 1, 2]]
# each step type: (SGLang's speculative top-k of the harness, one step on a Harness)
STEP_RUNS = {
    "decode": (1, lambda h: h.decode()),
    "prefill": (1, lambda h: h.prefill()),
    "verify_chain": (1, lambda h: h.verify(CHAIN_PATHS)),
    "verify_tree": (2, lambda h: h.verify(TREE_PATHS, TREE)),
    "verify_tree_track": (2, lambda h: h.verify(TREE_PATHS, TREE, track=[4, 5])),
}


def count_family(family: str, steps=STEPS) -> dict:
    """Each step type of ``steps`` twice (the first run makes the lazy buffers), the second counted."""
    T, runs = DRAFTS, STEP_RUNS
    out = {}
    rec = Recorder()
    with rec.installed():
        for name in steps:
            topk, step = runs[name]
            with contextlib.ExitStack() as stack:
                h = Harness(family, rec, T, topk, stack)
                h.decode()
                step(h)
                rec.take()
                step(h)
                out[name] = summarize(rec.take(), len(LAYERS))
    return out


def emit(res: dict, out: Path | None) -> None:
    """Print a result as JSON, and write it to ``out`` when given."""
    text = json.dumps(res, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["gdn", "mamba2"], choices=["gdn", "mamba2"])
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ["SGLANG_REPLAYSSM_OPS"] = "kernels"   # the pool's Triton kernels, as on a GPU
    from tests.sglang_plugin.conftest import load_plugin

    load_plugin()
    res = {"command": "python bench/plugin_op_counts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "torch": torch.__version__, "layers": len(LAYERS), "batch": len(SLOTS), "draft_tokens": 4,
           "note": "eager device ops per step on CPU (aten ops that launch a kernel + Triton launches); "
                   "a step's ops = per_step + layers x per_layer",
           "families": {f: count_family(f, args.steps) for f in args.families}}
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
