"""Before any timing: every kernel on CUDA against the PyTorch reference (bench/kernels.py's `checks`)."""
from __future__ import annotations

import copy

import torch

from kernel_harness import ACT, DEV, L, RESULTS, KernelTuning, kgdn, kkda, km2, make_inputs, make_pool, verify_methods


def gpu_checks():
    """Fresh random inputs on CUDA: kernels vs the PyTorch reference, max relative error."""
    from sglang_replayssm.reference import gdn as rgdn, mamba2 as rm2
    refs = {"gdn": (kgdn, rgdn), "mamba2": (km2, rm2)}
    if kkda is not None:
        from sglang_replayssm.reference import kda as rkda
        refs["kda"] = (kkda, rkda)
    for fam, (km, rm) in refs.items():
        geo = dict(family=fam, H=8, Hk=4 if fam != "kda" else 8, Dv=64, Dk=128)
        for rc, method in (("none", "fused"), ("fp8", "fused"), ("none", "split"), ("fp8", "split")):
            pk = make_pool(geo, 12, read_copy=rc)
            if rc == "fp8":
                from sglang_replayssm.reference.quant import quant_fp8_rows
                pk.rc[:], pk.rc_scale[:] = quant_fp8_rows(pk.ckpt)
            pk.cursor.copy_(torch.randint(0, L, pk.cursor.shape, device=DEV, dtype=torch.int32))
            pr = copy.deepcopy(pk)
            slots = torch.tensor([3, 1, 7, 12, 5, 0], dtype=torch.int32, device=DEV)
            errs = []
            for step in range(L + 2):
                inp = make_inputs(geo, 6)
                inp = {k: (v.float() if v.dtype == ACT else v) for k, v in inp.items()}
                kw = dict(method=method, tuning=KernelTuning(flush_block_k=geo["Dk"])) if method == "split" else dict(
                    method=method)
                o1 = km.decode(pk, 0, slots, **inp, **kw)
                o2 = rm.decode(pr, 0, slots, **inp)
                errs.append(((o1[:-1].double() - o2[:-1].double()).norm() / o2[:-1].double().norm()).item())
                pk.advance(slots)
                pr.advance(slots)
            ck = ((pk.ckpt[:, 1:] - pr.ckpt[:, 1:]).double().norm() / pr.ckpt[:, 1:].double().norm()).item()
            row = dict(family=fam, read_copy=rc, what=f"decode x18 steps, {method}", max_rel_err_out=max(errs),
                       rel_err_ckpt=ck)
            if hasattr(km, "verify"):
                try:
                    for tree, T, vm in [(False, 4, None), (True, 4, None), (False, 2, None)] + [
                            (tree, 4, m) for m in verify_methods(geo) for tree in (False, True)]:
                        inp = make_inputs(geo, 6, T=T)
                        inp = {k: (v.float() if v.dtype == ACT else v) for k, v in inp.items()}
                        par = torch.tensor([[-1, 0, 0, 1]] * 6, dtype=torch.int32, device=DEV) if tree else None
                        pr.cursor.copy_(pk.cursor)
                        o1 = km.verify(pk, 0, slots, **inp, parents=par, **({"method": vm} if vm else {}))
                        o2 = rm.verify(pr, 0, slots, **inp, parents=par)
                        row[f"max_rel_err_verify_T{T}_{'tree' if tree else 'chain'}" + (f"_{vm}" if vm else "")] = (
                            (o1[:-1].double() - o2[:-1].double()).norm() / o2[:-1].double().norm()).item()
                    # the whole commit of the last verify's drafts (rows that reach the window fold), padding row 0
                    acc = torch.tensor([4, 1, 3, 0, 2, 0], dtype=torch.int32, device=DEV)
                    km.commit(pk, slots, acc)
                    rm.commit(pr, slots, acc)
                    row["commit_pointers_equal"] = bool(torch.equal(pk.cursor, pr.cursor)
                                                        and torch.equal(pk.folded, pr.folded))
                    row["rel_err_ckpt_commit"] = ((pk.ckpt[:, 1:] - pr.ckpt[:, 1:]).double().norm()
                                                  / pr.ckpt[:, 1:].double().norm()).item()
                except Exception as e:  # noqa: BLE001
                    row["verify_error"] = repr(e)[:200]
            print("CHECK", row)
            RESULTS["checks"].append(row)
        # conventional
        st = torch.randn(9, geo["H"], geo["Dv"], geo["Dk"], device=DEV) * 0.1
        st0 = st.clone()
        slots = torch.tensor([2, 8, 0, 5], dtype=torch.int32, device=DEV)
        inp = make_inputs(geo, 4)
        inp = {k: (v.float() if v.dtype == ACT else v) for k, v in inp.items()}
        o1 = km.conventional_decode(st, slots, **inp)
        o2, s2 = rm.conventional_step(st0[slots.long()], **inp)
        row = dict(family=fam, what="conventional", max_rel_err_out=((o1 - o2).double().norm() / o2.double().norm()).item(),
                   rel_err_state=((st[slots.long()][[0, 1, 3]] - s2[[0, 1, 3]]).double().norm() / s2.double().norm()).item())
        print("CHECK", row)
        RESULTS["checks"].append(row)
