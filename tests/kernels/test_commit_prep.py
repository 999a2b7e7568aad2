"""A verify commit's index preparation with its counts, and a flush's rows and pointer move, in one Triton launch each
(kernels/commit_prep.py), against the PyTorch reference (reference.commit_prep); the reference against the plain
bookkeeping it replaces (each row's slot, accepted count, path, last node and track rows worked out row by row)."""
import random

import pytest
import torch

from sglang_replayssm.kernels import commit_prep as kern
from sglang_replayssm.reference import commit_prep as ref
from sglang_replayssm.reference import replay

from .helpers import DEV, clone_pool, make_pool

WINDOW, T = 4, 5
MODES = ("chain", "positions", "parents", "last_chain")


def _tree(rng, chain):
    return list(range(-1, T - 1)) if chain else [-1] + [rng.randrange(n) for n in range(1, T)]


def _path(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _case(B, mode, seed):
    """B rows (distinct live slots, then padding rows 0 and -1): their trees, accepted paths, track slots and
    boundary nodes, as SGLang hands them to a commit."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    chain = mode in ("chain", "last_chain")
    slots = (torch.randperm(B - 1, generator=gen)[: B - 2] + 1).tolist() + [0, -1]
    trees = [_tree(rng, chain) for _ in range(B)]
    paths = [_path(t, rng.randrange(-1, T)) for t in trees]
    track = [rng.choice([0, B + 1 + b]) for b in range(B)]
    steps = [rng.choice([-1, p[rng.randrange(len(p))]]) if p else -1 for p in paths]
    return slots, trees, paths, track, steps


def _run(fn, pool, B, mode, case, counts, with_track):
    slots, trees, paths, track, steps = case
    t = lambda x, dt=torch.int64: torch.tensor(x, dtype=dt, device=DEV)   # noqa: E731
    out = torch.full((ref.COMMIT_PREP_ROWS, B), 99, dtype=torch.int32, device=DEV)
    nodes = None if mode in ("chain", "last_chain") else torch.full((B, T), 99, dtype=torch.int32, device=DEV)
    kw = dict(track=t(track), steps=t(steps, torch.int32)) if with_track else {}
    if mode == "positions":
        kw["positions"] = t([[b * T + n for n in p] + [-1] * (T - len(p)) for b, p in enumerate(paths)])
    if mode == "parents":
        kw["parents"] = t(trees, torch.int32)
    if mode in ("parents", "last_chain"):
        kw["from_last"] = True
        accepted = t([p[-1] if p else -1 for p in paths])
    else:
        accepted = t([len(p) for p in paths], torch.int32)
    fn(pool, t(slots, torch.int32), accepted, T, counts, out, nodes, **kw)
    return out, nodes


@pytest.mark.parametrize("with_track", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B", [4, 150])   # one block of the kernel, and two (BLOCK 128)
def test_commit_prep_matches_reference_and_plain_bookkeeping(B, mode, with_track):
    seed = B * 10 + MODES.index(mode) * 2 + with_track
    pool = make_pool("gdn", window=WINDOW, num_slots=2 * B + 1, num_layers=1, gen=torch.Generator().manual_seed(seed))
    case = _case(B, mode, seed)
    c_ref = torch.full((12,), 3, dtype=torch.int64, device=DEV)
    c_ker = c_ref.clone()
    cursor = pool.cursor.clone()
    out_r, nodes_r = _run(ref.commit_prep, pool, B, mode, case, c_ref, with_track)
    out_k, nodes_k = _run(kern.commit_prep, pool, B, mode, case, c_ker, with_track)
    rows_written = ref.COMMIT_PREP_ROWS if with_track else ref.TRACK_DST
    assert torch.equal(out_k[:rows_written], out_r[:rows_written]), (out_k, out_r)
    assert nodes_r is None or torch.equal(nodes_k, nodes_r)
    assert torch.equal(c_ker, c_ref)
    assert torch.equal(pool.cursor, cursor)                       # preparing moves nothing
    # the plain bookkeeping, row by row
    slots, trees, paths, track, steps = case
    got = out_r.tolist()
    accs = []
    for b, (s, p) in enumerate(zip(slots, paths)):
        live = s > 0
        a = len(p) if live else 0
        accs.append(a)
        assert [got[ref.ROWS][b], got[ref.ACC][b], got[ref.SRC_ROWS][b]] == [max(s, 0), a, b]
        assert got[ref.LAST][b] == (p[-1] if live and p else -1)
        if nodes_r is not None:
            assert nodes_r[b].tolist() == p + [-1] * (T - len(p))
        if with_track:
            on = live and steps[b] >= 0 and track[b] > 0
            upto = p.index(steps[b]) + 1 if on else 0
            want = [track[b], s, upto, steps[b]] if on else [0, 0, 0, -1]
            assert [got[r][b] for r in range(ref.TRACK_DST, ref.COMMIT_PREP_ROWS)] == want
    plain = torch.full((12,), 3, dtype=torch.int64, device=DEV)
    replay.count_commit(pool, torch.tensor([max(s, 0) for s in slots], device=DEV), torch.tensor(accs, device=DEV),
                        T, plain)
    assert torch.equal(c_ref, plain)


def test_commit_prep_without_counts_checks_and_empty_batch():
    pool = make_pool("mamba2", window=WINDOW, num_slots=8, num_layers=1)
    case = _case(5, "positions", 1)
    out_r, nodes_r = _run(ref.commit_prep, pool, 5, "positions", case, None, True)
    out_k, nodes_k = _run(kern.commit_prep, pool, 5, "positions", case, None, True)
    assert torch.equal(out_k, out_r) and torch.equal(nodes_k, nodes_r)
    empty = torch.zeros(0, dtype=torch.int32, device=DEV)
    counts = torch.ones(12, dtype=torch.int64, device=DEV)
    for fn in (ref.commit_prep, kern.commit_prep):
        fn(pool, empty, empty, T, counts, torch.zeros(ref.COMMIT_PREP_ROWS, 0, dtype=torch.int32, device=DEV))
    assert counts.tolist() == [1] * 12
    slots = torch.tensor([1, 2], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="needs nodes"):
        kern.commit_prep(pool, slots, slots, T, None, torch.zeros(8, 2, dtype=torch.int32, device=DEV),
                         positions=torch.zeros(2, T, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match="out must have"):
        kern.commit_prep(pool, slots, slots, T, None, torch.zeros(4, 2, dtype=torch.int32, device=DEV))


@pytest.mark.parametrize("B", [6, 300])   # one block, and three with repeats across blocks
def test_flush_prep_and_move_match_reference_and_plain_bookkeeping(B):
    gen = torch.Generator().manual_seed(B)
    pool = make_pool("gdn", window=WINDOW, num_slots=B, num_layers=1, gen=gen)
    rows = torch.randint(-1, B // 2 + 1, (B,), generator=gen)   # repeats, padding 0 and -1
    rows[0], rows[-1] = 1, 1
    rows = rows.to(DEV)
    twin = clone_pool(pool)
    cursor, folded = pool.cursor.clone(), pool.folded.clone()
    out_r = torch.full((2, B), 99, dtype=torch.int32, device=DEV)
    out_k = out_r.clone()
    ref.flush_prep(pool, rows, out_r)
    kern.flush_prep(twin, rows.to(torch.int32), out_k)
    assert torch.equal(out_k, out_r)
    ref.flush_move(pool, out_r[0], out_r[1])
    kern.flush_move(twin, out_k[0], out_k[1])
    assert torch.equal(pool.cursor[1:], twin.cursor[1:]) and torch.equal(pool.folded[1:], twin.folded[1:])
    seen, want = set(), []
    for s in rows.tolist():
        keep = s > 0 and s not in seen
        seen.add(s)
        want.append((s, int(cursor[s])) if keep else (0, 0))
    assert list(zip(*out_r.tolist())) == want
    for s in range(1, B + 1):
        c = int(cursor[s]) if s in seen else 0
        assert (int(pool.cursor[s]), int(pool.folded[s])) == ((0, int(folded[s]) + c) if c else
                                                              (int(cursor[s]), int(folded[s])))
