"""Patch a copy of sglang_replayssm (argv[1]: the copy's root) into a timing variant (argv[2]): prepN (the
split decode's prep kernels in N warps) or nregN (its flush launch compiled with maxnreg=N)."""
import sys
root, var = sys.argv[1], sys.argv[2]
fams = {"gdn": "_gdn", "mamba2": "_m2", "kda": "_kda"}
for fam, pre in fams.items():
    p = f"{root}/sglang_replayssm/kernels/{fam}.py"
    s = open(p).read()
    if var.startswith("prep"):
        w = var[4:]
        i = s.index(f"{pre}_decode_prep_kernel[")
        j = s.index("num_warps=4)", i)
        s = s[:j] + f"num_warps={w})" + s[j + len("num_warps=4)"):]
    elif var.startswith("nreg"):
        n = var[4:]
        old = 'FLUSH_ONLY=method == "split", num_warps=nw)'
        assert s.count(old) == 1, (fam, var)
        s = s.replace(old, f'FLUSH_ONLY=method == "split", num_warps=nw, **({{"maxnreg": {n}}} if method == "split" else {{}}))')
    open(p, "w").write(s)
print("patched", root, var)
