"""A checkpoint or weights write that fails (disk full, file size limit) ends in one line, leaves no temp
files, keeps the previous checkpoint loadable, and --resume then finishes the run bitwise."""

import errno
import re
import resource
import subprocess

import pytest
import safetensors.torch
from safetensors.torch import load_file

from helpers import tiny_corpus, tiny_recipe
from plm_process import env_for, plm, plm_cmd, sha256, steady_files
from plmcli import api
from plmcli.errors import WriteFailed

# Above a checkpoint's weights (~430 kB), below its optimizer state (~870 kB).
LIMIT = 600_000


def _limited(root, *args):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))  # Python ignores SIGXFSZ: writes get EFBIG

    return subprocess.run(plm_cmd(*args), capture_output=True, text=True, env=env_for(root), timeout=300, preexec_fn=limit)


def _no_litter(run):
    assert not [p for p in run.rglob(".*") if p.name != ".lock"], list(run.rglob(".*"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("disk")
    recipe, corpus = steady_files(root)
    p = plm(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", root / "full")  # also caches the corpus
    assert p.returncode == 0, p.stderr
    return root, recipe, corpus, sha256(root / "full" / "model.safetensors")


@pytest.mark.e2e
def test_first_checkpoint_write_fails(reference):
    root, recipe, corpus, want = reference
    run = root / "first"
    p = _limited(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: cannot write the checkpoint of step 10 in {run / 'checkpoints'}: file too large"), err
    assert f"then continue with `plm pretrain --resume --out {run}`" in err and "Traceback" not in p.stderr
    _no_litter(run)
    assert not list(run.glob("checkpoints/step-*")) and not (run / "model.safetensors").exists()
    p = plm(root, "pretrain", "--resume", "--out", run)  # no checkpoint: it starts again from step 0
    assert p.returncode == 0, p.stderr
    assert sha256(run / "model.safetensors") == want


@pytest.mark.e2e
def test_later_checkpoint_write_fails_previous_one_resumes(reference):
    root, recipe, corpus, want = reference
    run = root / "later"
    assert plm(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run, "--stop-after", "10").returncode == 0
    (run / "model.safetensors").unlink()
    p = _limited(root, "pretrain", "--resume", "--out", run)
    assert p.returncode == 2, p.stderr
    assert "cannot write the checkpoint of step 20" in p.stderr.strip().splitlines()[-1], p.stderr
    _no_litter(run)
    assert sorted(c.name for c in (run / "checkpoints").iterdir()) == ["step-10"]
    p = plm(root, "pretrain", "--resume", "--out", run)
    assert p.returncode == 0, p.stderr
    assert sha256(run / "model.safetensors") == want


def _safetensors_error(code: int, kind: str, message: str):
    """What safetensors raises when its write fails: its own error around Rust's IoError."""
    from safetensors import SafetensorError

    return SafetensorError(f'Error while serializing: IoError(Os {{ code: {code}, kind: {kind}, message: "{message}" }})')


@pytest.mark.parametrize("raised", ["oserror", "safetensors"])
def test_weights_write_fails_no_space(tmp_path, monkeypatch, raised):
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"))
    run = tmp_path / "run"
    save = safetensors.torch.save_model

    def full_disk(model, filename, *a, **k):
        open(filename, "wb").write(b"partial")
        if raised == "safetensors":  # as a real full disk reports it (was a traceback: "this is a bug in plm")
            raise _safetensors_error(errno.ENOSPC, "StorageFull", "No space left on device")
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(safetensors.torch, "save_model", full_disk)
    with pytest.raises(WriteFailed) as e:
        api.pretrain(str(recipe), [str(corpus)], str(run))
    assert re.match(rf"cannot write model\.safetensors in {re.escape(str(run))}: no space left on device "
                    r"\([\d.]+ [kMG]B free there, it needs about [\d.]+ kB\) — free some space there \(or write "
                    rf"elsewhere\), then continue with `plm pretrain --resume --out {re.escape(str(run))}`", str(e.value)), e.value
    _no_litter(run)
    assert not (run / "model.safetensors").exists() and (run / "checkpoints" / "step-6").is_dir()
    monkeypatch.setattr(safetensors.torch, "save_model", save)
    api.pretrain(out=str(run), resume=True)
    a, b = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(run / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a)


@pytest.mark.e2e
def test_final_weights_write_fails_then_resume_writes_them(reference):
    """A run whose last checkpoint is there but whose final weights do not fit (a limit under the weights'
    ~430 kB): one line naming model.safetensors, no temp file, and --resume writes the same weights."""
    import shutil

    root, recipe, corpus, want = reference
    run = root / "final"
    shutil.copytree(root / "full", run)
    (run / "model.safetensors").unlink()
    (run / "summary.json").unlink()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    p = subprocess.run(plm_cmd("pretrain", "--resume", "--out", run), capture_output=True, text=True,
                       env=env_for(root), timeout=300, preexec_fn=limit)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: cannot write model.safetensors in {run}: file too large"), err
    assert err.endswith(f"then continue with `plm pretrain --resume --out {run}`; the files written before are intact"), err
    _no_litter(run)
    p = plm(root, "pretrain", "--resume", "--out", run)
    assert p.returncode == 0, p.stderr
    assert sha256(run / "model.safetensors") == want


def test_checkpoint_that_does_not_fit_says_free_and_needed(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as `[enforce fail at inline_container.cc] . unexpected pos`: the
    line says no space left, with what is free and what a checkpoint of this run takes (the last one's size)."""
    import accelerate

    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    api.pretrain(str(recipe), [str(corpus)], str(run), stop_after=3)  # step-3 is its last checkpoint
    last = max((run / "checkpoints").iterdir())
    size = sum(f.stat().st_size for f in last.rglob("*") if f.is_file())
    save = accelerate.Accelerator.save_state

    def full_disk(self, output_dir, *a, **k):
        save(self, output_dir, *a, **k)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1216 vs 1154")

    monkeypatch.setattr(accelerate.Accelerator, "save_state", full_disk)
    with pytest.raises(WriteFailed) as e:
        api.pretrain(out=str(run), resume=True)
    m = re.match(r"cannot write the checkpoint of step 6 in .*: no space left on device \([\d.]+ [kMG]B free there, "
                 r"it needs about ([\d.]+) kB\)", str(e.value))
    assert m and float(m.group(1)) == pytest.approx(size / 1000, abs=0.05), e.value
    _no_litter(run)
