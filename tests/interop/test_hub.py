"""Hugging Face Hub names wherever plm takes a run (plmcli.interop.hub), fully offline: a Hub cache is laid out
by hand (models--ORG--NAME/snapshots/<commit>/ + refs/<revision>) from tiny transformers models saved with
save_pretrained, so `plm import NAME`, `--from NAME` and `--model NAME` find them with HF_HUB_OFFLINE=1."""

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers import assert_clean_error, finetune, run, tiny_corpus
from test_finetune import SAMPLE
from test_hf_export import _hf_checkpoint
from plmcli import api
from plmcli.errors import PlmError
from plmcli.interop import hf, hub

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PINNED = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """model_type -> a save_pretrained directory: bert (vocab.txt, model.safetensors) and gpt2 (tokenizer.json,
    pytorch_model.bin only)."""
    root = tmp_path_factory.mktemp("hf")
    corpus = tiny_corpus(root / "c.txt")
    for model_type in ("bert", "gpt2"):
        _hf_checkpoint(root / model_type, model_type, corpus)
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hub cache, offline; the conversions go under this test's PLM_RUNS (conftest)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    return tmp_path / "hub-cache"


def cached(cache: Path, repo_id: str, source: Path, commit: str = COMMIT, refs=("main",)) -> Path:
    """`source`'s files as the Hub cache holds revision `commit` of `repo_id`, each ref in `refs` naming it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(source, repo / "snapshots" / commit)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return repo


def runs_dir() -> Path:
    return Path(os.environ["PLM_RUNS"])


def test_import_a_hub_name_converts_it_once_and_finetune_reads_it(cache, checkpoints, monkeypatch, tmp_path):
    cached(cache, "org/tiny-bert", checkpoints / "bert")
    res = run("import", "org/tiny-bert")
    assert res.exit_code == 0, res.output
    dest = runs_dir() / "hub" / "org--tiny-bert"
    assert str(dest) in res.stdout and "bert" in res.stdout
    origin = json.loads((dest / "config.json").read_text())["imported_from"]
    assert origin["hub"] == {"repo_id": "org/tiny-bert", "revision": None, "commit": COMMIT}
    assert not [p for p in dest.parent.iterdir() if p != dest]  # no temp directory left beside it
    stamp = (dest / "model.safetensors").stat().st_mtime_ns

    def no_second_conversion(*a, **k):
        raise AssertionError("converted again")

    convert = hf.import_hf
    monkeypatch.setattr(hf, "import_hf", no_second_conversion)
    res = finetune("sst2", from_run="org/tiny-bert", data_dir=str(SAMPLE), train__max_steps=2, train__batch_size=8,
                   task__max_seq_len=16, out=str(tmp_path / "ft"))
    assert res["steps"] == 2 and res["from_run"] == str(dest.resolve())
    res = run("import", "org/tiny-bert")
    assert res.exit_code == 0 and "imported already" in res.stdout, res.output
    assert (dest / "model.safetensors").stat().st_mtime_ns == stamp
    assert api.import_hf("org/tiny-bert") == {"out": str(dest), "hub": origin["hub"], "reused": True}
    # --out: the same model into a directory of one's own
    monkeypatch.setattr(hf, "import_hf", convert)
    res = api.import_hf("org/tiny-bert", str(tmp_path / "mine"))
    assert res["out"] == str(tmp_path / "mine") and res["family"] == "bert" and res["hub"]["commit"] == COMMIT


def test_cli_finetune_from_a_hub_name(cache, checkpoints, tmp_path):
    cached(cache, "tiny-bert", checkpoints / "bert")  # an id with no org, as bert-base-uncased
    res = run("finetune", "--task", "sst2", "--data-dir", "glue-sample", "--from", "tiny-bert", "--max-steps", 2,
              "--batch-size", 8, "--set", "task.max_seq_len=16", "--out", tmp_path / "ft", "--json")
    assert res.exit_code == 0, res.output
    assert (runs_dir() / "hub" / "tiny-bert" / "config.json").is_file()


def test_eval_ppl_of_a_hub_gpt2_pinned_and_not(cache, checkpoints, tmp_path, monkeypatch):
    """gpt2's checkpoint has pytorch_model.bin only: the second pattern set fetches it."""
    cached(cache, "org/tiny-gpt2", checkpoints / "gpt2", refs=("main", "v1"))
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on a mat while dogs ran\n")
    local = api.import_hf(str(checkpoints / "gpt2"), str(tmp_path / "local"))["out"]
    want = api.eval_ppl([str(text)], model=local, max_length=24, stride=24)["nll"]
    res = run("eval-ppl", text, "--model", "org/tiny-gpt2", "--max-length", 24, "--stride", 24, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout[res.stdout.index("{"):])["nll"] == pytest.approx(want, abs=1e-6)
    calls = []
    convert = hf.import_hf
    monkeypatch.setattr(hf, "import_hf", lambda *a, **k: calls.append(a) or convert(*a, **k))
    for name in ("org/tiny-gpt2@v1", "org/tiny-gpt2@v1", f"org/tiny-gpt2@{COMMIT}"):
        assert api.eval_ppl([str(text)], model=name, max_length=24, stride=24)["nll"] == pytest.approx(want, abs=1e-6)
    assert len(calls) == 2  # v1 once, the commit once; the second v1 reads runs/hub/org--tiny-gpt2@v1
    assert (runs_dir() / "hub" / "org--tiny-gpt2@v1" / "config.json").is_file()
    assert (runs_dir() / "hub" / f"org--tiny-gpt2@{COMMIT}" / "config.json").is_file()
    rows = api.generate("org/tiny-gpt2", ["the cat"], max_new_tokens=3)
    assert rows[0]["prompt"] == "the cat" and len(calls) == 2
    assert_clean_error(run("eval-ppl", text, "--model", "org/tiny-gpt2@v9"), "revision 'v9' of org/tiny-gpt2",
                       "HF_HUB_OFFLINE")


def test_unknown_and_unreachable_names_are_one_line(cache, checkpoints, tmp_path, monkeypatch):
    text = tmp_path / "t.txt"
    text.write_text("some text\n")
    assert_clean_error(run("eval-ppl", text, "--model", "nobody/nothing"), "cannot reach the Hugging Face Hub to fetch "
                       "nobody/nothing", "HF_HUB_OFFLINE is set", "hf download nobody/nothing", "local directory")
    assert_clean_error(run("import", "nobody/nothing"), "nobody/nothing", "HF_HUB_OFFLINE")
    assert not (runs_dir() / "hub" / "nobody--nothing").exists()
    # a path whose folder exists stays a path: the local error, no Hub
    assert_clean_error(run("eval-ppl", text, "--model", "tests/no-such-run"), "not a plm run directory")
    # a model type plm has no family for: the import's own error, naming the id rather than the cache
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5"}))
    cached(cache, "org/t5-tiny", t5)
    assert_clean_error(run("import", "org/t5-tiny"), "org/t5-tiny: model_type 't5'", "supported model types")

    import httpx2
    from huggingface_hub import errors

    def failing(error):
        def snapshot_download(*a, **k):
            raise error
        return snapshot_download

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("huggingface_hub.snapshot_download", failing(errors.LocalEntryNotFoundError(
        "Got: ConnectError: [Errno -3] Temporary failure in name resolution\nAn error happened")))
    assert_clean_error(run("import", "org/x"), "cannot reach the Hugging Face Hub to fetch org/x (Got: ConnectError",
                       "connect, or set HF_HUB_OFFLINE=1 with the model in the local cache (hf download org/x)")
    response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/api/models/org/x"))
    monkeypatch.setattr("huggingface_hub.snapshot_download", failing(errors.RepositoryNotFoundError(
        "404 Client Error. Repository Not Found", response=response)))
    assert_clean_error(run("finetune", "--task", "sst2", "--data-dir", "glue-sample", "--from", "org/x"),
                       "org/x is neither a local directory nor a model on the Hugging Face Hub", "check the name")
    monkeypatch.setattr("huggingface_hub.snapshot_download", failing(errors.RevisionNotFoundError(
        "404 Client Error. Revision Not Found", response=response)))
    assert_clean_error(run("import", "org/x@nope"), "revision 'nope' of org/x not found", "org/x@main")


def test_an_interrupted_conversion_never_looks_complete(cache, checkpoints, monkeypatch):
    cached(cache, "org/tiny-bert", checkpoints / "bert")

    def killed(*a, **k):
        raise KeyboardInterrupt

    import safetensors.torch

    save_model = safetensors.torch.save_model
    monkeypatch.setattr(safetensors.torch, "save_model", killed)
    with pytest.raises(KeyboardInterrupt):
        api.resolve_run("org/tiny-bert")
    hub_root = runs_dir() / "hub"
    assert not hub_root.exists() or not any(hub_root.iterdir())
    monkeypatch.setattr(safetensors.torch, "save_model", save_model)
    assert api.resolve_run("org/tiny-bert") == hub_root / "org--tiny-bert"
    (hub_root / "org--tiny-bert" / "model.safetensors").write_bytes(b"damaged")
    with pytest.raises(PlmError, match=f"plm import org/tiny-bert --out {hub_root / 'org--tiny-bert'} --force"):
        api.load_run("org/tiny-bert")


def test_export_pushes_to_the_hub(cache, checkpoints, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    calls = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **k: calls.append(("create_repo", repo_id, k))
                        or f"https://huggingface.co/{repo_id}")
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **k: calls.append(("upload_folder", k)))
    cached(cache, "org/tiny-gpt2", checkpoints / "gpt2")
    out = tmp_path / "exported"
    res = run("export", "org/tiny-gpt2", "--format", "hf", "--out", out, "--push-to-hub", "me/tiny-gpt2")
    assert res.exit_code == 0, res.output
    assert "pushed to https://huggingface.co/me/tiny-gpt2" in res.stdout
    assert calls[0] == ("create_repo", "me/tiny-gpt2", {"repo_type": "model", "exist_ok": True})
    upload = calls[1][1]
    assert calls[1][0] == "upload_folder" and upload["repo_id"] == "me/tiny-gpt2" and upload["folder_path"] == str(out)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert_clean_error(run("export", "org/tiny-gpt2", "--format", "arpa", "--out", tmp_path / "lm.arpa",
                           "--push-to-hub", "me/x"), "--push-to-hub", "--format hf")
    assert len(calls) == 2 and not (tmp_path / "lm.arpa").exists()


def test_names_and_directories():
    assert hub.is_hub_name("bert-base-uncased") and hub.is_hub_name("org/name@v1.0")
    assert not hub.is_hub_name(None) and not hub.is_hub_name("./x") and not hub.is_hub_name("/abs/x")
    assert not hub.is_hub_name("a/b/c") and not hub.is_hub_name("tests/nothing-here")  # tests/ exists here
    assert hub.split_name("org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    assert hub.hub_run_dir("org/name@refs/pr/1") == runs_dir() / "hub" / "org--name@refs--pr--1"
