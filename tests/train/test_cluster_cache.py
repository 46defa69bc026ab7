"""One process builds every cache, the others read it; the wait for it is not the training timeout; several
nodes (two torchrun agents on 127.0.0.1, a real c10d rendezvous) share a cache, build their own, or stop
in one line when their corpora differ.

Who wrote what is read from PLM_WRITE_LOG (data/store.py): every atomic write of every process appends
`RANK PATH` to it, and every file in a cache is written through one.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed

from helpers import TINY_RECIPE, free_port, tiny_corpus
from plm_process import env_for

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # per launch; each takes ~10 s on 2 busy cores
DETERMINISTIC = ["--set", "model.dropout=0.0"]

# Each recipe builds other caches: the corpus and its flat token files (GPT); make-mlm-data's static
# instances (BERT); RoBERTa's FULL-SENTENCES rows and whole-word units beside the tokens.
RECIPES = {
    "gpt": TINY_RECIPE,
    "bert-static": """\
extends: bert-mini
model: {n_layer: 1, n_head: 2, d_model: 32, d_ff: 64, max_positions: 64}
tokenizer: {vocab_size: 300, min_frequency: 1}
data: {val_fraction: 0.2}
objective: {dupe_factor: 1}
train: {seq_len: 32, global_batch_size: 4, max_steps: 2, eval_every: 2, eval_batches: 2, save_every: 2, log_every: 1}
""",
    "roberta-wwm": """\
extends: roberta-mini
model: {n_layer: 1, n_head: 2, d_model: 32, d_ff: 64, max_positions: 34}
tokenizer: {vocab_size: 300, min_frequency: 1}
data: {val_fraction: 0.2}
objective: {masking: wwm}
train: {seq_len: 32, global_batch_size: 4, micro_batch_size: 2, max_steps: 2, eval_every: 2, eval_batches: 2, save_every: 2, log_every: 1}
""",
}
BUILT = {"gpt": ["corpora/*/train.*.tokens.bin", "corpora/*/validation.*.tokens.bin"],
         "bert-static": ["corpora/*/dataset", "mlm/*/dataset"],
         "roberta-wwm": ["corpora/*/train.*.full-30.rows.npy", "corpora/*/train.*.word_starts.bin"]}


def _env(root: Path, cache: str, log: str) -> dict:
    return env_for(root, PLM_CACHE=str(root / cache), PLM_WRITE_LOG=str(root / log),
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _writes(log: Path) -> list[tuple[str, Path]]:
    """(rank, path) of every atomic write the processes logged."""
    if not log.is_file():
        return []
    return [(rank, Path(path)) for rank, path in (line.split(" ", 1) for line in log.read_text().splitlines())]


def _in(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _cache_writers(log: Path, cache: Path) -> set[str]:
    """The ranks that wrote into `cache`, after checking that every file in it came from a logged write."""
    writes = [(rank, p) for rank, p in _writes(log) if _in(p, cache.resolve())]
    files = [p.resolve() for p in cache.rglob("*") if p.is_file()]
    assert files and all(any(_in(f, p) for _, p in writes) for f in files), "a cache file no logged write made"
    return {rank for rank, _ in writes}


def test_the_fingerprint_is_the_corpus_not_where_or_when_its_files_are(tmp_path):
    """Two nodes' copies of one text (other paths, other mtimes) have other cache keys and one fingerprint."""
    from plmcli.config import load_recipe
    from plmcli.data.corpus import prepare_corpus
    from plmcli.data.store import content_fingerprint, load_meta

    (tmp_path / "r.yaml").write_text(TINY_RECIPE)
    r = load_recipe(str(tmp_path / "r.yaml"))
    a = tiny_corpus(tmp_path / "a.txt")
    b = tmp_path / "b.txt"
    b.write_bytes(a.read_bytes())
    os.utime(b, ns=(1_000_000_000, 1_000_000_000))
    metas = [load_meta(prepare_corpus([str(f)], r.tokenizer, r.data, tmp_path / f"cache-{f.stem}")) for f in (a, b)]
    assert metas[0]["key"] != metas[1]["key"]
    assert content_fingerprint(metas[0]) == content_fingerprint(metas[1])
    other = load_meta(prepare_corpus([str(tiny_corpus(tmp_path / "c.txt", n_docs=12))], r.tokenizer, r.data, tmp_path / "c"))
    assert content_fingerprint(other) != content_fingerprint(metas[0])


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_two_processes_build_a_fresh_cache_once(tmp_path, name):
    """torchrun --nproc_per_node 2 on an empty PLM_CACHE: rank 0 writes every cache file, rank 1 none."""
    (tmp_path / "r.yaml").write_text(RECIPES[name])
    corpus = tiny_corpus(tmp_path / "c.txt", n_docs=40)
    head = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port())]
    res = subprocess.run([sys.executable, *head, "-m", "plmcli", "pretrain", "--recipe", str(tmp_path / "r.yaml"),
                          "--data", str(corpus), "--out", str(tmp_path / "run"), *DETERMINISTIC],
                         cwd=tmp_path, env=_env(tmp_path, "cache", "writes.log"), capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-3000:]
    cache = tmp_path / "cache"
    for pattern in BUILT[name]:
        assert list(cache.glob(pattern)), pattern
    assert _cache_writers(tmp_path / "writes.log", cache) == {"0"}


def test_a_build_that_fails_stops_every_process_in_its_words(tmp_path):
    """Rank 0 finds the corpus empty while rank 1 waits for it: both stop with that one line, at once."""
    (tmp_path / "r.yaml").write_text(TINY_RECIPE)
    (tmp_path / "blank.txt").write_text("\n \n\n")
    head = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port())]
    res = subprocess.run([sys.executable, *head, "-m", "plmcli", "pretrain", "--recipe", str(tmp_path / "r.yaml"),
                          "--data", str(tmp_path / "blank.txt"), "--out", str(tmp_path / "run")],
                         cwd=tmp_path, env=_env(tmp_path, "cache", "writes.log"), capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    lines = sorted(line for line in res.stderr.splitlines() if line.startswith("error"))
    why = "the input contains no text (every line is blank) — check the input files"
    assert lines == [f"error (process 0 of 2): {why}", f"error (process 1 of 2): {why}"], res.stderr[-3000:]
    # Each exits 2 after its line, as torchrun reports it, unless torchrun stopped it first (SIGTERM, once the
    # other exited) or it aborted in the interpreter's teardown after its line (SIGABRT: "terminate called
    # without an active exception", seen with two gloo processes exiting at once before these checks too, and
    # after destroy_process_group: not plm's groups). The lines above show each stopped on the error.
    codes = re.findall(r"exitcode  : (-?\d+)", res.stderr)
    assert codes and set(codes) <= {"2", "-15", "-6"}, res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


WAIT_SCRIPT = """\
import time

import torch.distributed as dist

from plmcli.train import distributed

made = []
new_group = dist.new_group
dist.new_group = lambda *a, **k: made.append(k) or new_group(*a, **k)
state = distributed.process_state(5)  # the training collectives give up after 5 s
distributed.process_state(5)  # again, as the loop does: the same groups
assert [(k["backend"], k["timeout"].total_seconds()) for k in made] == [("gloo", 24 * 3600.0)], made
with distributed.main_builds_first(state):
    if state.is_main_process:
        time.sleep(7)  # preparing the data takes longer than the training timeout
dist.barrier()  # then a training collective, on the default group
print("waited", flush=True)
try:  # the control: the same wait on the default group (accelerate's main_process_first) times out
    with state.main_process_first():
        if state.is_main_process:
            time.sleep(7)
    print("no timeout", flush=True)
except Exception:
    print("timed out", flush=True)
"""


def test_preparation_waits_outside_the_training_timeout(tmp_path):
    """train.dist_timeout 5 s, rank 0 prepares for 7 s: the others wait on the 24-hour gloo group and the
    run goes on; the same wait on the default group fails after 5 s."""
    (tmp_path / "wait.py").write_text(WAIT_SCRIPT)
    head = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port())]
    res = subprocess.run([sys.executable, *head, str(tmp_path / "wait.py")], cwd=tmp_path,
                         env=_env(tmp_path, "cache", "writes.log"), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.stdout.count("waited") == 2, res.stdout + res.stderr[-3000:]
    assert "timed out" in res.stdout and "no timeout" not in res.stdout, res.stdout


def _two_nodes(tmp_path: Path, caches: tuple[str, str], data: tuple[Path, Path],
               args: tuple = ("--max-steps", "3", *DETERMINISTIC)) -> list[subprocess.CompletedProcess]:
    """`plm pretrain` of the tiny recipe (tmp_path/tiny.yaml) with `args` on two torchrun agents (--nnodes 2,
    one process each) joined by a c10d rendezvous on 127.0.0.1: node i with PLM_CACHE caches[i] and --data data[i]."""
    port = free_port()
    procs = []
    for i in (0, 1):
        head = ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "plm-issue-41",
                # both agents run on this machine: say which one hosts the rendezvous store
                "--rdzv-conf", f"is_host={int(i == 0)}"]
        cmd = [sys.executable, *head, "-m", "plmcli", "pretrain", "--recipe", str(tmp_path / "tiny.yaml"),
               "--data", str(data[i]), "--out", str(tmp_path / "run"), *args]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=_env(tmp_path, caches[i], f"writes{i}.log"),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for cmd_proc in procs:
        try:
            out, err = cmd_proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        done.append(subprocess.CompletedProcess(cmd_proc.args, cmd_proc.returncode, out, err))
    return done


@pytest.fixture
def nodes(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY_RECIPE)
    return tmp_path, tiny_corpus(tmp_path / "c.txt")


def test_two_nodes_with_one_shared_cache_build_it_once(nodes):
    root, corpus = nodes
    for res in _two_nodes(root, ("cache", "cache"), (corpus, corpus)):
        assert res.returncode == 0, res.stderr[-3000:]
    log = root / "writes.log"
    log.write_text("".join(p.read_text() for p in (root / "writes0.log", root / "writes1.log") if p.is_file()))
    assert _cache_writers(log, root / "cache") == {"0"}  # node 1 read node 0's cache
    assert len(list((root / "cache").rglob("meta.json"))) == 1


def test_two_nodes_with_their_own_caches_each_build_one(nodes):
    """A node-local PLM_CACHE: the main process of each node builds its node's copy."""
    root, corpus = nodes
    for res in _two_nodes(root, ("cache-a", "cache-b"), (corpus, corpus)):
        assert res.returncode == 0, res.stderr[-3000:]
    # The rendezvous, not the launch order, numbers the nodes: each cache was built by its own node's rank.
    writers = [_cache_writers(root / f"writes{i}.log", root / c) for i, c in enumerate(("cache-a", "cache-b"))]
    assert sorted(writers, key=sorted) == [{"0"}, {"1"}]
    for c in ("cache-a", "cache-b"):
        assert len(list((root / c).glob("corpora/*/train.*.tokens.bin"))) == 1


def test_a_node_with_other_data_stops_every_process_in_one_line(nodes):
    root, corpus = nodes
    other = tiny_corpus(root / "other.txt", n_docs=12)  # another text where node 1 reads its --data
    start = time.monotonic()
    results = _two_nodes(root, ("cache", "cache"), (corpus, other))
    assert time.monotonic() - start < TIMEOUT_S  # not a hang until a timeout
    errors = []
    for res in results:
        assert res.returncode != 0, res.stderr[-3000:]
        # plm's exit 2 as torchrun reports it, or a teardown abort after the line (see the test above)
        codes = re.findall(r"exitcode  : (-?\d+)", res.stderr)
        assert codes and set(codes) <= {"2", "-15", "-6"}, res.stderr[-3000:]
        lines = [line for line in res.stderr.splitlines() if line.startswith("error")]
        # one line, and no traceback through plm (torchrun's agent prints its own to report the exit codes)
        assert len(lines) == 1 and f"{os.sep}plmcli{os.sep}" not in res.stderr, res.stderr[-3000:]
        errors.append(lines[0])
    for line in errors:
        assert "prepared other data than the main process's node" in line and "give every node the same --data" in line
    assert {line.split("): ", 1)[1] for line in errors} == {errors[0].split("): ", 1)[1]}  # the same words on both
    assert sorted(line.split(":")[0] for line in errors) == ["error (process 0 of 2)", "error (process 1 of 2)"]
    assert not (root / "run").exists()


@pytest.mark.parametrize("name", ["gpt", "bert-static"])
def test_two_nodes_train_as_one_process_with_accumulation_2(tmp_path, name):
    """Two nodes of one process each (micro batch 2) end with the weights of one process with micro batch 2 ×
    accumulation 2, bitwise, dropout on: the same samples per step, each loss part over the step's targets on
    both nodes, and every dropout mask drawn from (seed, global micro-batch)."""
    (tmp_path / "tiny.yaml").write_text(RECIPES[name])
    corpus = tiny_corpus(tmp_path / "c.txt")
    steps = ["--max-steps", "4"]
    for res in _two_nodes(tmp_path, ("cache", "cache"), (corpus, corpus), args=steps):
        assert res.returncode == 0, res.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "plmcli", "pretrain", "--recipe", str(tmp_path / "tiny.yaml"), "--data",
                          str(corpus), "--out", str(tmp_path / "one"), *steps, "--set", "train.micro_batch_size=2"],
                         cwd=tmp_path, env=_env(tmp_path, "cache", "one.log"), capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "2 micro-batches each" in one.stderr
    two, ref = ((tmp_path / d / "model.safetensors").read_bytes() for d in ("run", "one"))
    assert two == ref
