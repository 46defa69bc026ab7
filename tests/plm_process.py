"""Real `python -m plmcli` processes for the tests that need signals, locks or resource limits."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import free_port, tiny_corpus

# About a hundred milliseconds of steps a second on one thread: long enough to be hit at random moments,
# with accumulation (2 micro-batches per step) so a checkpoint's data position says which step it holds.
STEADY_RECIPE = """\
extends: gpt-mini
model: {n_layer: 2, n_head: 2, d_model: 64, max_positions: 64, dropout: 0.1, attn_dropout: 0.0}
tokenizer: {kind: char, vocab_size: 200, min_frequency: 1, special_tokens: {eos: "<eos>", unk: "<unk>"}}
data: {val_fraction: 0.1}
train: {seq_len: 32, global_batch_size: 8, micro_batch_size: 4, max_steps: 40, eval_every: 10, eval_batches: 2,
        save_every: 10, log_every: 5}
optim: {lr: 3.0e-3, warmup_steps: 4, schedule: cosine}
"""
ACCUM = 2


def steady_files(root: Path) -> tuple[Path, Path]:
    recipe = root / "steady.yaml"
    recipe.write_text(STEADY_RECIPE, encoding="utf-8")
    return recipe, tiny_corpus(root / "corpus.txt", n_docs=120)


def env_for(root: Path, **extra) -> dict:
    # One thread: the same float reductions in every process (bitwise comparisons), and no contention.
    return {**os.environ, "PLM_RUNS": str(root / "runs"), "PLM_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def plm_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "plmcli", *map(str, args)]


def plm(root: Path, *args, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(plm_cmd(*args), capture_output=True, text=True, env=env_for(root), timeout=timeout, **kwargs)


def start(root: Path, *args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(plm_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_for(root), **kwargs)


def wait_for_step(run: Path, proc: subprocess.Popen, step: int = 1, timeout: float = 240) -> bool:
    """Poll metrics.jsonl until a training row of at least `step` is there; False if the process ended first."""
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.is_file():
            rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip().endswith("}")]
            if any(r.get("step", 0) >= step and "loss" in r for r in rows):
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    raise TimeoutError(f"{run} did not reach step {step}")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def assert_interrupted(p, stderr: str, run: Path, code: int = 130) -> None:
    """The deferred stop's report: `interrupted — ...`, exit 130 (Ctrl-C; 75 after SIGTERM / SIGUSR1), no traceback."""
    assert p.returncode == code and "Traceback" not in stderr, stderr
    assert f"plm pretrain --resume --out {run}" in stderr.replace("\n", ""), stderr


def start_ranks(root: Path, world: int, *args) -> list[subprocess.Popen]:
    """`plm ARGS` as `world` gloo processes joined the way a launcher joins them (env://: RANK, WORLD_SIZE,
    MASTER_ADDR/PORT), without a launcher in between: a test signals or kills each process itself, as a
    scheduler does."""
    port = str(free_port())
    return [subprocess.Popen(plm_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env_for(root, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                                         LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
            for r in range(world)]
