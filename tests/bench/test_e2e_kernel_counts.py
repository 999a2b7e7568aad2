"""bench/e2e_kernel_counts.py counts the device kernels of one forward on CPU (Triton under the interpreter):
the counts must be real launches of the model's structure — the fused non-SSM kernels launch fewer kernels
than the torch path through more Triton launches of their own, every SSM layer is stubbed and counted apart."""
import json

from tests.bench_scripts import load_bench


def test_fused_forward_launches_fewer_kernels(tmp_path):
    mod = load_bench("e2e_kernel_counts.py")
    out = tmp_path / "counts.json"
    assert mod.main(["--models", "tiny-gdn", "--out", str(out)]) == 0
    counts = json.loads(out.read_text())["models"]["tiny-gdn"]
    for mode in ("decode", "verify"):
        torch_path, fused = counts[f"{mode}_torch"], counts[f"{mode}_fused"]
        assert fused["kernels"] < torch_path["kernels"], (mode, fused["kernels"], torch_path["kernels"])
        assert fused["triton"] > torch_path["triton"] > 0, mode   # attention is Triton in both; fused adds its own
        assert fused["kernels"] == fused["triton"] + fused["aten"]
        assert torch_path["ssm_layers_excluded"] == fused["ssm_layers_excluded"] == 2   # tiny-gdn: 2 SSM layers
