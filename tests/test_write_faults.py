"""Every weight writer under a small file size limit (RLIMIT_FSIZE, as `ulimit -f` sets it) in a real process:
`plm export` to HF, word2vec and ARPA end in the one `error: cannot write …: file too large …` line with
exit 2, no traceback, and no temp file or half output left; the same export then succeeds without the limit.
(Checkpoints and a pretrain's final weights: tests/train/test_disk_full.py.)"""

import resource
import subprocess

import pytest

from helpers import run, tiny_corpus, tiny_gpt_run
from plm_process import env_for, plm_cmd

pytestmark = pytest.mark.e2e

LIMIT = 4096  # bytes: over the small files (config.json, vocab), under every weights file of the runs below


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("writers")
    corpus = tiny_corpus(root / "c.txt")
    w2v = run("pretrain", "--recipe", "word2vec-sg", "--data", corpus, "--out", root / "w2v",
              "--set", "model.dim=64", "--set", "model.epochs=1")
    ngram = run("pretrain", "--recipe", "ngram-kn5", "--data", corpus, "--out", root / "ngram")
    assert w2v.exit_code == 0 and ngram.exit_code == 0, (w2v.output, ngram.output)
    return root, {"hf": tiny_gpt_run(root), "word2vec": root / "w2v", "arpa": root / "ngram"}


def _limited(root, *args):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))  # Python ignores SIGXFSZ: writes get EFBIG

    return subprocess.run(plm_cmd(*args), capture_output=True, text=True, env=env_for(root), timeout=300, preexec_fn=limit)


@pytest.mark.parametrize("fmt, name", [("hf", "hf-out"), ("word2vec", "vectors.txt"), ("arpa", "lm.arpa")])
def test_export_over_the_size_limit_is_one_line_and_leaves_nothing(runs, fmt, name):
    root, made = runs
    out = root / "out" / fmt / name
    p = _limited(root, "export", made[fmt], "--format", fmt, "--out", out)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    where = out.parent  # HF's OUT is a directory, built in a temp directory beside it that must be gone
    assert lines[0].startswith(f"error: cannot write {name} in {where}: "), lines[0]
    assert "file too large (over the file size limit, ulimit -f) — raise the file size limit (ulimit -f)" in lines[0]
    assert not out.exists() and [p.name for p in where.iterdir()] == [], list(where.iterdir())
    res = run("export", made[fmt], "--format", fmt, "--out", out)  # no limit: the same command writes it whole
    assert res.exit_code == 0, res.output
    biggest = max((f.stat().st_size for f in out.rglob("*")), default=0) if out.is_dir() else out.stat().st_size
    assert biggest > LIMIT  # the limit did cut a real weights file
