"""checks.token_rows: which layouts the kernels read in place (SGLang's split views of one projection) and which are
copied first, and the row stride the kernels get."""
import torch

from sglang_replayssm.kernels.checks import token_rows


def _proj(lead, width):
    return torch.randn(*lead, width)


def test_split_views_are_read_in_place_with_the_projection_stride():
    proj = _proj((5,), 2 * 8 + 12 + 3)
    q, k, v, _ = torch.split(proj, [8, 8, 12, 3], dim=-1)
    q, k, v = q.view(5, 2, 4), k.view(5, 2, 4), v.view(5, 3, 4)
    (q2, k2), row = token_rows(q, k, lead=1)
    assert row == proj.shape[-1] and q2 is q and k2 is k
    (v2,), vrow = token_rows(v, lead=1)
    assert vrow == proj.shape[-1] and v2 is v
    # verify inputs [B, T, heads, dim]: the two token dims step through the projection's rows
    proj = _proj((6,), 8 + 8 + 5)
    q = torch.split(proj, [8, 8, 5], dim=-1)[0].view(3, 2, 2, 4)
    (q2,), row = token_rows(q, lead=2)
    assert row == proj.shape[-1] and q2 is q


def test_contiguous_inputs_keep_their_row_size():
    q, k = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    (q2, k2), row = token_rows(q, k, lead=1)
    assert row == 16 and q2 is q and k2 is k
    (none, k3), row = token_rows(None, k, lead=1)
    assert none is None and k3 is k and row == 16


def test_other_layouts_are_copied():
    proj = _proj((4,), 40)
    view = proj[:, :16].view(4, 2, 8)
    cont = torch.randn(4, 2, 8)
    # one stride per group: a view beside a contiguous tensor -> both contiguous, the row size
    (a, b), row = token_rows(view, cont, lead=1)
    assert row == 16 and a.is_contiguous() and b is cont and torch.equal(a, view)
    # heads not contiguous within a row (transposed), rows expanded (stride 0), rows overlapping
    trans = torch.randn(4, 8, 2).transpose(1, 2)
    expanded = torch.randn(1, 2, 8).expand(4, 2, 8)
    overlap = torch.randn(40).as_strided((4, 2, 8), (8, 8, 1))
    for t in (trans, expanded, overlap):
        (c,), row = token_rows(t, lead=1)
        assert row == 16 and c.is_contiguous() and torch.equal(c, t)
    # [B, T] lead dims that do not collapse into one stride
    gappy = _proj((3, 5), 16)[:, :2].reshape(3, 2, 2, 8)
    assert gappy.stride(0) != 2 * gappy.stride(1)
    (c,), row = token_rows(gappy, lead=2)
    assert row == 16 and c.is_contiguous() and torch.equal(c, gappy)


def test_single_row_keeps_its_own_stride():
    proj = _proj((1,), 30)
    q = proj[:, :16].view(1, 2, 8)
    (q2,), row = token_rows(q, lead=1)
    assert q2 is q and row == q.stride(0)    # any stride reads one row: the tensor's own, no copy
    (e,), row = token_rows(torch.randn(0, 2, 8), lead=1)
    assert e.numel() == 0 and row == 16
