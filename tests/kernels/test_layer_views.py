"""kernels.layer_views: the wrappers' per-layer views are built once per pool layer and always view that pool's own
tensors (a cloned pool gets its own), and a pool the kernels cannot take is still refused."""
import pytest
import torch

from sglang_replayssm.kernels import gdn as kgdn
from sglang_replayssm.kernels.layer_views import layer_views
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry

from .helpers import DEV, GEOS, clone_pool, make_pool


def test_views_are_kept_per_layer_and_follow_the_pool():
    pool = make_pool("gdn", read_copy="fp8", gen=torch.Generator().manual_seed(5))
    v0, v1 = layer_views(pool, 0), layer_views(pool, 1)
    assert layer_views(pool, 0) is v0 and v0 is not v1
    assert v0.ckpt.data_ptr() == pool.ckpt[0].data_ptr() and v1.rc.data_ptr() == pool.rc[1].data_ptr()
    twin = clone_pool(pool)   # a deep copy: its own tensors (its views must not write the original's)
    t0 = layer_views(twin, 0)
    assert t0.ckpt.data_ptr() == twin.ckpt[0].data_ptr() != pool.ckpt[0].data_ptr()
    assert t0.cursor.data_ptr() == twin.cursor.data_ptr() != pool.cursor.data_ptr()
    # a kernel step on the clone leaves the original untouched
    H, Dv, Dk = twin.geo.state_shape
    g = torch.Generator().manual_seed(6)
    r = lambda *s: torch.randn(*s, generator=g).to(DEV)
    before = pool.rec_d.clone()
    kgdn.decode(twin, 0, torch.tensor([1, 2], dtype=torch.int32, device=DEV), q=r(2, 2, Dk), k=r(2, 2, Dk),
                v=r(2, H, Dv), a=r(2, H), b=r(2, H), A_log=r(H), dt_bias=r(H))
    assert torch.equal(pool.rec_d, before) and not torch.equal(twin.rec_d, before)


def test_pools_the_kernels_cannot_take_are_refused_every_time():
    pool = ReplayStatePool(SSMGeometry(**GEOS["gdn"]), 2, 3, ReplayConfig(window=4, mode="conventional"), device=DEV)
    for _ in range(2):   # nothing cached for a refused pool
        with pytest.raises(ValueError, match="mode='replay'"):
            layer_views(pool, 0)
    with pytest.raises(ValueError, match="layer must be in"):
        layer_views(make_pool("gdn"), 7)
