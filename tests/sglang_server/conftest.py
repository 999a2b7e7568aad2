"""The real SGLang server, with and without our plugin, on this CPU machine (the CPU harness).

One server runs at a time in a test process (``servers.get(name)`` stops the previous one): each is SGLang's whole stack
(HTTP front end, tokenizer manager, scheduler with its radix cache and memory pools, model runner,
detokenizer) started as a user would, ``python -m sglang_replayssm.launch --engine sglang --device cpu``
(plugin on) or ``python -m sglang.launch_server`` under the harness (plugin off), on 127.0.0.1 and a
free port. Tests of one configuration sit together in their module, so each configuration starts once; a module's
last server stops with the module (the ``servers`` fixture is module-scoped).

The oracle is ``transformers``: greedy tokens of the same checkpoint (``checks.py``).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="the SGLang server tests need the sglang package (pip install -e .[test])")
requests = pytest.importorskip("requests")

from sglang_replayssm.checkpoint_names import OVERLAY_ENV  # noqa: E402
from sglang_replayssm.cpu_harness import OVERLAP_ENV, cpu_server_args, harness_env  # noqa: E402
from sglang_replayssm.cpu_harness.bridge import TREE_LOG_ENV  # noqa: E402

START_TIMEOUT_S = 300
PROMPTS = ("The quick brown fox", "hello, world! How are you", "def main(argv):\n    for i in range(10):")
NEW_TOKENS = 20

# the plugin at window 4 with metrics and NGRAM drafts (4 tokens), the radix cache's extra_buffer strategy on the
# track grid of 64 tokens, and NEXTN (MTP) drafts as EAGLE trees (top-2, 2 steps, 4 draft tokens): parts of the
# configurations below
NGRAM_L4 = ["--replayssm-window", "4", "--enable-metrics", "--speculative-algorithm", "NGRAM",
            "--speculative-num-draft-tokens", "4"]
XBUF_64 = ["--mamba-radix-cache-strategy", "extra_buffer", "--mamba-track-interval", "64"]
# SGLang's default strategy, given explicitly so the CPU harness adds no no_buffer of its own: with the overlap
# scheduler SGLang resolves it to extra_buffer, which the plugin makes extra_buffer_lazy (sglang_plugin/cli.py)
AUTO_64 = ["--mamba-radix-cache-strategy", "auto", "--mamba-track-interval", "64"]
NEXTN_TREE_L4 = ["--replayssm-window", "4", "--enable-metrics", "--speculative-algorithm", "NEXTN",
                 "--speculative-num-steps", "2", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4"]
METRICS_EVERY_STEP = {"SGLANG_REPLAYSSM_METRICS_INTERVAL": "1"}   # metrics pushed at every step: exact counts


def eagle3_l4(family: str, topk: int, steps: int, draft_tokens: int) -> list[str]:
    """The plugin at window 4 with metrics and EAGLE3 drafts from the family's tiny head (the ``eagle3_heads``
    fixture writes it: ``{models}`` is the tiny-models folder)."""
    return ["--replayssm-window", "4", "--enable-metrics", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", f"{{models}}/{family}_eagle3", "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft_tokens)]

# name -> (family, plugin on, extra argv, extra env)
CONFIGS: dict[str, tuple[str, bool, list[str], dict]] = {
    "gdn-stock": ("qwen3_next", False, [], {}),
    "gdn-sglang-replayssm": ("qwen3_next", False, ["--enable-linear-replayssm"], {}),
    # the radix cache's extra_buffer_lazy strategy with pages of 16 and the overlap scheduler (track grid 64 tokens)
    "gdn-L16": ("qwen3_next", True, ["--mamba-radix-cache-strategy", "extra_buffer_lazy", "--replayssm-window", "16",
                                     "--mamba-track-interval", "64", "--page-size", "16", "--enable-metrics",
                                     "--max-running-requests", "4"], {OVERLAP_ENV: "1"}),
    "gdn-L4-kernels": ("qwen3_next", True, ["--replayssm-window", "4"], {"SGLANG_REPLAYSSM_OPS": "kernels"}),
    # the fp8 read copy read by the non-flush steps (3 of every 4), the window folded exactly from the fp16-SR
    # checkpoint (the delta rule replayed from the records' raw v and beta)
    "gdn-L4-fp16sr-fp8": ("qwen3_next", True, ["--replayssm-window", "4", "--replayssm-ckpt-precision", "fp16-sr",
                                               "--replayssm-read-copy", "fp8"], {}),
    # NGRAM with the radix cache's default strategy and the overlap scheduler (SGLang's defaults on a GPU; with the
    # plugin extra_buffer_lazy): track slots written at accepted-prefix boundaries inside the verify commit (track
    # grid lcm(FLA chunk 64, page 1, interval) = 64 tokens), the NGRAM worker splicing the previous step's accepted
    # tokens
    "gdn-ngram": ("qwen3_next", True, [*NGRAM_L4, *AUTO_64], {OVERLAP_ENV: "1"}),
    # tensor parallelism: two scheduler processes (one per TP rank, joined by gloo), each with its shard of the SSM
    # heads; metrics pushed at every step so the counts a test reads after a request are exact
    "gdn-tp2-ngram": ("qwen3_next", True, ["--tp", "2", *NGRAM_L4, *XBUF_64],
                      {"SGLANG_REPLAYSSM_METRICS_INTERVAL": "1"}),
    "m2-tp2-ngram": ("nemotron_h", True, ["--tp", "2", *NGRAM_L4], {"SGLANG_REPLAYSSM_METRICS_INTERVAL": "1"}),
    "m2-stock": ("nemotron_h", False, [], {}),
    "m2-L4": ("nemotron_h", True, ["--replayssm-window", "4", "--enable-metrics"], {}),
    "m2-L1-kernels": ("nemotron_h", True, ["--replayssm-window", "1"], {"SGLANG_REPLAYSSM_OPS": "kernels"}),
    "m2-L16-nvfp4": ("nemotron_h", True, ["--replayssm-read-copy", "nvfp4"], {}),
    # NGRAM as SGLang serves it on a GPU by default: the radix cache's default strategy (with the plugin
    # extra_buffer_lazy; track grid: the Mamba-2 chunk, 256 tokens) and the overlap scheduler
    "m2-ngram": ("nemotron_h", True, [*NGRAM_L4, "--mamba-radix-cache-strategy", "auto"], {OVERLAP_ENV: "1"}),
    # Kimi Linear (KDA + MLA; the harness picks SGLang's Triton attention backend for MLA)
    "kda-stock": ("kimi_linear", False, [], {}),
    "kda-L4-fp8-kernels": ("kimi_linear", True, ["--replayssm-window", "4", "--replayssm-read-copy", "fp8",
                                                 "--enable-metrics"], {"SGLANG_REPLAYSSM_OPS": "kernels"}),
    # Kimi Linear with NGRAM drafts verified by the plugin's KDA verify, SGLang's GPU defaults (extra_buffer, track
    # grid 64 = the KDA chunk, the overlap scheduler)
    "kda-ngram": ("kimi_linear", True, [*NGRAM_L4, *XBUF_64], {OVERLAP_ENV: "1"}),
    # Qwen3-Next + its MTP layer: NEXTN drafts as EAGLE trees (top-2, 2 steps, 4 draft tokens); the harness logs every
    # verify the plugin opens with a draft tree
    "gdn-mtp-tree": ("qwen3_next_mtp", True, NEXTN_TREE_L4, {TREE_LOG_ENV: "1"}),
    # the same with SGLang's GPU defaults: the overlap scheduler (SGLang's spec-v2 EAGLE worker) and the radix cache's
    # default strategy (extra_buffer_lazy with the plugin)
    "gdn-mtp-tree-overlap": ("qwen3_next_mtp", True, [*NEXTN_TREE_L4, *AUTO_64], {TREE_LOG_ENV: "1", OVERLAP_ENV: "1"}),
    # EAGLE3 draft heads (SGLang's LlamaForCausalLMEagle3): Qwen3-Next's reads its aux hidden states (layers 1-3),
    # as trees (top-3, 3 steps, 6 draft tokens) and as chains with SGLang's GPU defaults (the overlap scheduler, the
    # default strategy: extra_buffer_lazy with the plugin);
    # Nemotron-H's reads its final hidden state (SGLang 0.5.23 captures no aux states for Nemotron-H), as trees
    "gdn-eagle3-tree": ("qwen3_next", True, eagle3_l4("qwen3_next", 3, 3, 6),
                        {TREE_LOG_ENV: "1", **METRICS_EVERY_STEP}),
    "gdn-eagle3-chain-overlap": ("qwen3_next", True, [*eagle3_l4("qwen3_next", 1, 3, 4), *AUTO_64],
                                 {OVERLAP_ENV: "1", **METRICS_EVERY_STEP}),
    "m2-eagle3-tree": ("nemotron_h", True, eagle3_l4("nemotron_h", 2, 3, 6), {TREE_LOG_ENV: "1", **METRICS_EVERY_STEP}),
}

# configurations served from the folder exactly as transformers 5 saved it (its names, not SGLang's): our launcher
# serves it through an overlay folder (sglang_replayssm.checkpoint_names); stock SGLang reads the family's folder
TRANSFORMERS5_FOLDERS = {"m2-L4": "nemotron_h_transformers5", "gdn-L4-kernels": "qwen3_next_transformers5"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangServer:
    """One SGLang server process group, started by this test session (stopped by its own PID group)."""

    def __init__(self, name: str, model_dir: Path, log_dir: Path):
        family, plugin, extra, env_extra = CONFIGS[name]
        self.name, self.family, self.plugin = name, family, plugin
        self.model_dir = model_dir / TRANSFORMERS5_FOLDERS.get(name, family)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        argv = ["--model-path", str(self.model_dir), "--device", "cpu",
                *(a.replace("{models}", str(model_dir)) for a in extra)]
        if plugin:
            cmd = [sys.executable, "-m", "sglang_replayssm.launch", "--engine", "sglang", "--host", "127.0.0.1",
                   "--port", str(self.port), *argv]
            env = dict(os.environ)
        else:   # stock SGLang: its own launcher, the harness only (our plugin loads but stays inactive)
            cmd = [sys.executable, "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(self.port),
                   *cpu_server_args(argv)]
            env = harness_env()
        env.pop("SGLANG_REPLAYSSM_OPTIONS", None)
        # no py-spy / CUDA core dump at a child's exit: the stop below signals the whole group, which SGLang's
        # launcher takes for a crash and would wait 5 s for those diagnostics (there is no GPU here)
        env.update(SGLANG_PYSPY_DUMP_BEFORE_CRASH="0", SGLANG_CUDA_COREDUMP_BEFORE_CRASH="0")
        env.update(env_extra)
        env[OVERLAY_ENV] = str(log_dir / "checkpoint-overlays")
        self.cmd = cmd
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        self._wait_healthy()
        self.startup_s = time.monotonic() - self.started

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.name}: not healthy after {START_TIMEOUT_S}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:   # the group SGLang's launcher spawned (schedulers, detokenizer): ours, by group id
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    # -- requests --------------------------------------------------------------------------
    def generate(self, input_ids, max_new_tokens: int = NEW_TOKENS, timeout: float = 300, **sampling) -> dict:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True, **sampling}
        r = requests.post(self.url + "/generate", json={"input_ids": input_ids, "sampling_params": params},
                          timeout=timeout)
        assert r.status_code == 200, r.text
        return r.json()

    def generate_logprobs(self, input_ids, max_new_tokens: int = NEW_TOKENS, top: int = 0) -> dict:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
        r = requests.post(self.url + "/generate", json={"input_ids": input_ids, "sampling_params": params,
                                                        "return_logprob": True, "top_logprobs_num": top},
                          timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    def metrics(self) -> str:
        r = requests.get(self.url + "/metrics", timeout=30)
        assert r.status_code == 200, r.text
        return r.text


class Servers:
    def __init__(self, model_dir: Path, log_dir: Path):
        self.model_dir, self.log_dir = model_dir, log_dir
        self.current: SGLangServer | None = None
        self.startup_s: dict[str, float] = {}
        self.failed: dict[str, str] = {}

    def get(self, name: str) -> SGLangServer:
        if self.current is not None and self.current.name == name:
            return self.current
        self.close()
        if name in self.failed:
            pytest.fail(f"{name} failed to start earlier:\n{self.failed[name]}")
        try:
            self.current = SGLangServer(name, self.model_dir, self.log_dir)
        except RuntimeError as e:
            self.failed[name] = str(e)
            raise
        self.startup_s[name] = self.current.startup_s
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> Path:
    from sglang_replayssm.cpu_harness.tiny_checkpoints import FAMILIES, KIMI, QWEN3_NEXT_MTP, write_checkpoint

    out = tmp_path_factory.mktemp("tiny-sglang-models")
    for fam in FAMILIES + (KIMI, QWEN3_NEXT_MTP):
        write_checkpoint(fam, out / fam, seed=0)
    for fam in sorted(set(TRANSFORMERS5_FOLDERS.values())):   # the same weights, config.json as transformers 5 saves it
        write_checkpoint(fam.removesuffix("_transformers5"), out / fam, seed=0, sglang_names=False)
    return out


# the prompt whose greedy continuation (EAGLE3_FOLLOW_TOKENS tokens, transformers') the tiny EAGLE3 heads draft
EAGLE3_FOLLOW_PROMPT = PROMPTS[0]
EAGLE3_FOLLOW_TOKENS = 40
# the target layers whose hidden states each head reads (None: its final hidden state)
EAGLE3_AUX_LAYERS = {"qwen3_next": [0, 1, 2], "nemotron_h": None}


@pytest.fixture(scope="session")
def eagle3_heads(tiny_models) -> dict[str, list[int]]:
    """The tiny EAGLE3 heads of ``eagle3_l4`` (``tiny_checkpoints.write_eagle3_head``), built to draft the target's
    own greedy continuation of EAGLE3_FOLLOW_PROMPT (transformers'), which a served target therefore accepts; other
    prompts get drafts it rarely accepts. Returns family -> that continuation."""
    import torch

    from sglang_replayssm.cpu_harness.tiny_checkpoints import write_eagle3_head

    follow = {}
    for fam, aux in EAGLE3_AUX_LAYERS.items():
        ids = list(tokenize(str(tiny_models / fam), EAGLE3_FOLLOW_PROMPT))
        model, seq = _hf_model(str(tiny_models / fam)), list(ids)
        with torch.no_grad():   # greedy, end-of-sequence tokens included (the server ignores them)
            for _ in range(EAGLE3_FOLLOW_TOKENS):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        follow[fam] = seq[len(ids):]
        write_eagle3_head(tiny_models / fam, tiny_models / f"{fam}_eagle3", follow=ids[-1:] + follow[fam],
                          aux_layers=aux)
    return follow


@pytest.fixture(scope="module")
def servers(tiny_models, tmp_path_factory):
    """The servers of one module: its last server stops with it (under ``pytest -n 2`` a worker goes on to other
    groups after its server files, and a server left running would hold its processes and memory beside them)."""
    s = Servers(tiny_models, tmp_path_factory.mktemp("sglang-server-logs"))
    yield s
    s.close()
    if s.startup_s:
        print("\nSGLang server start-up (s): " + json.dumps({k: round(v, 1) for k, v in s.startup_s.items()}))


@functools.lru_cache(maxsize=None)
def _hf_model(model_dir: str):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


@functools.lru_cache(maxsize=None)
def tokenize(model_dir: str, text: str) -> tuple[int, ...]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    return tuple(tok(text, add_special_tokens=False).input_ids)


def prompt_ids(server: SGLangServer, text: str) -> list[int]:
    return list(tokenize(str(server.model_dir), text))


def metric_value(text: str, name: str) -> float:
    """Sum of a metric's samples (every label set) in a Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    total, seen = 0.0, False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                total += s.value
                seen = True
    assert seen, f"{name} not exported"
    return total
