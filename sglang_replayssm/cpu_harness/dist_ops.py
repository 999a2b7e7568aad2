"""Tensor parallelism on the CPU harness: what SGLang's CPU engine needs to run ``--tp N`` on a machine
without its CPU kernel build or one NUMA node per rank.

SGLang's CPU engine runs one scheduler process per TP rank and joins them with ``torch.distributed`` over
gloo (its ``GroupCoordinator.all_reduce`` / ``all_gather`` take gloo when the shared-memory kernels are not
available, which they are not here). ``bridge.install()`` adds in every process (``register()`` and the
patches of ``AFTER_IMPORT``):

* per-rank CPU binding: SGLang's ``numa_utils.init_threads_binding`` asserts one NUMA node per rank unless
  ``SGLANG_CPU_OMP_THREADS_BIND`` names the cores of each rank. When it is unset and there are more ranks
  than NUMA nodes, the harness sets it to an even split of the cores this process may run on (rank ``i``
  gets core ``i mod n`` when there are fewer cores than ranks); an explicit value always wins.
* gloo versions of the shared-memory collectives (``torch.ops.sgl_kernel.initialize``,
  ``init_cpu_threads_env``, ``shm_allreduce``, ``shm_allgather``), which SGLang calls instead of gloo on
  hosts it takes for its AMX / arm64 kernel build (``is_shm_available``). They act on the default process
  group, which is the TP group there (SGLang takes this path only when ``world_size == local_size``).
"""

from __future__ import annotations

import os

import torch

BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
_LIB = None


def split_cores(cores: list[int], ranks: int) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` value giving each of ``ranks`` ranks its share of ``cores``."""
    cores = sorted(cores)
    if ranks <= 0 or not cores:
        raise ValueError(f"cannot split {cores} over {ranks} ranks")
    if len(cores) < ranks:
        groups = [[cores[i % len(cores)]] for i in range(ranks)]
    else:
        per, extra = divmod(len(cores), ranks)
        groups, start = [], 0
        for i in range(ranks):
            n = per + (1 if i < extra else 0)
            groups.append(cores[start:start + n])
            start += n
    return "|".join(",".join(map(str, g)) for g in groups)


def _bind_threads_per_rank(mod) -> None:
    original = mod.init_threads_binding
    if getattr(original, "_cpu_harness", False):
        return

    def init_threads_binding(*, numa_index, world_size):
        split = not os.environ.get(BIND_ENV) and world_size > len(mod.get_cpu_ids_by_node())
        if split:
            os.environ[BIND_ENV] = split_cores(list(os.sched_getaffinity(0)), world_size)
        cpu_ids = original(numa_index=numa_index, world_size=world_size)
        if split and world_size > 1:
            # SGLang sizes each rank's thread pool only on its AMX / arm64 kernel build (init_cpu_threads_env);
            # elsewhere every rank would run one intra-op thread per core of the machine: N ranks oversubscribe
            torch.set_num_threads(len(_cpu_list(cpu_ids)))
        return cpu_ids

    init_threads_binding._cpu_harness = True
    mod.init_threads_binding = init_threads_binding


def _no_nccl_on_cpu(mod) -> None:
    """SGLang builds a PyNccl communicator for every TP group unless libnccl fails to load, which it does on a
    CPU build of torch; PyPI's CUDA build ships libnccl, and the communicator then enters ``torch.cuda.device``
    with the CPU device ("Expected a cuda device, but got: cpu"). On a CPU device it is built disabled, as a
    missing libnccl leaves it, and the group uses gloo."""
    cls = mod.PyNcclCommunicator
    original = cls.__init__
    if getattr(original, "_cpu_harness", False):
        return

    def __init__(self, group, device, *args, **kwargs):
        if torch.device(device).type == "cpu" if isinstance(device, (str, torch.device)) else False:
            self.group, self.available, self.disabled = group, False, True
            self.rank = torch.distributed.get_rank(group)
            self.world_size = torch.distributed.get_world_size(group)
            return
        original(self, group, device, *args, **kwargs)

    __init__._cpu_harness = True
    cls.__init__ = __init__


AFTER_IMPORT = {
    "sglang.srt.utils.numa_utils": _bind_threads_per_rank,
    "sglang.srt.distributed.device_communicators.pynccl": _no_nccl_on_cpu,
}


# --- gloo versions of SGLang's shared-memory collectives (sgl_kernel's CPU build) --------------------------

def initialize_cpu(size: int, rank: int) -> None:
    """SGLang's shm all-reduce set-up; gloo needs none (the default process group exists already)."""


def _cpu_list(cpu_ids: str) -> set[int]:
    """The cores of a "0,1" / "0-3" list."""
    ids: set[int] = set()
    for part in cpu_ids.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            ids.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            ids.add(int(part))
    return ids


def init_cpu_threads_env(cpu_ids: str) -> str:
    """Bind this rank's threads to ``cpu_ids`` ("0,1" / "0-3" lists) and use that many intra-op threads."""
    ids = _cpu_list(cpu_ids)
    if ids:
        os.sched_setaffinity(0, ids)
        torch.set_num_threads(len(ids))
    return cpu_ids


def shm_allreduce(data: torch.Tensor, op: int) -> None:
    import torch.distributed as dist

    assert op == 0, f"shm_allreduce: only SUM (0) is used by SGLang, got {op}"
    dist.all_reduce(data)


def shm_allgather(data: torch.Tensor, dim: int) -> torch.Tensor:
    import torch.distributed as dist

    parts = [torch.empty_like(data) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, data.contiguous())
    return torch.cat(parts, dim=dim)


_SCHEMAS = {
    "initialize": ("initialize(int size, int rank) -> ()", initialize_cpu),
    "init_cpu_threads_env": ("init_cpu_threads_env(str cpu_ids) -> str", init_cpu_threads_env),
    "shm_allreduce": ("shm_allreduce(Tensor(a!) data, int reduce_op) -> ()", shm_allreduce),
    "shm_allgather": ("shm_allgather(Tensor data, int dim) -> Tensor", shm_allgather),
}


def register() -> None:
    """The collectives above, once per process (``AFTER_IMPORT``'s patches are the bridge's to install)."""
    global _LIB
    from .cpu_ops import register_schemas

    if _LIB is None:
        _LIB = register_schemas(_SCHEMAS)
