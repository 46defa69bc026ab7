"""`plm pretrain --streaming`: lanes read the text once, resume is exact and seeks, ranks read apart."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data import streaming
from plmcli.data.corpus import token_stream, tokenize_corpus
from plmcli.data.streaming import TextStream, lane_pieces, prepare_stream_corpus
from plmcli.errors import PlmError

pytestmark = pytest.mark.usefixtures("one_thread")
CHAR = TokenizerConfig(kind="char", vocab_size=200, min_frequency=1, special_tokens={"eos": "<eos>", "unk": "<unk>"})


@pytest.fixture
def setup(tmp_path):
    return tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")


def digests(batches) -> list[str]:
    """sha1 of each batch's input_ids (the `fed` fixture's tensors), comparable as a list."""
    return [hashlib.sha1(x.numpy().tobytes()).hexdigest() for x in batches]


def _windows(x, key):
    return {"input_ids": x}


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _position(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step-{step}" / "loop_state.json").read_text())["data_position"]


def _edge_files(d: Path) -> list[str]:
    """Three files with what lane cuts must survive: runs of blank lines, CRLF, a missing final newline,
    whitespace-only lines, a file that is one long document."""
    d.mkdir(parents=True, exist_ok=True)
    texts = [
        "".join(f"doc {i} line one\nline two of {i}\n" + "\n" * (1 + i % 3) for i in range(25)),
        "crlf first\r\nsecond\r\n\r\n \t \nafter spaces\nlast line without newline",
        "".join(f"one long document, line {i}\n" for i in range(40)),
    ]
    files = []
    for i, t in enumerate(texts):
        (d / f"{i}.txt").write_bytes(t.encode("utf-8"))
        files.append(str(d / f"{i}.txt"))
    return files


def test_streaming_pretrain_runs(setup, tmp_path):
    recipe, corpus = setup
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "run"), streaming=True)
    assert s["steps"] == 6 and s["tokens"] == 6 * 4 * 16 and s["stop_reason"] == "max_steps"
    assert s["val_loss"] > 0 and (tmp_path / "run" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["streaming"] is True
    pos = _position(tmp_path / "run", 6)
    assert pos["readers"] == 1 and pos["rows"] == 4 and len(pos["ranks"]) == 1
    # 6 windows of 16 tokens per lane (each char one token): every lane moved past its start
    meta = json.loads((Path(json.loads((tmp_path / "run" / "config.json").read_text())["corpus"]) / "meta.json").read_text())
    starts = [p[0].start for p in lane_pieces(meta["streaming"]["files"], meta["streaming"]["sizes"],
                                              meta["streaming"]["train_end"], 4)]
    assert all(lane[2] > start for lane, start in zip(pos["ranks"][0]["positions"][0], starts))


def _epoch(lane) -> list[int]:
    out = []
    for key, ids in lane.units:
        if key[0] == 1:  # the lane started its second epoch
            return out
        out.extend(ids)


def test_lanes_read_every_training_line_once(tmp_path):
    """Lanes, concatenated, are the tokenized corpus's token stream, however the bytes are cut; the lanes
    of 2 processes × 2 readers × 3 rows are 12 stretches that never overlap."""
    from tokenizers import Tokenizer

    from plmcli.data.streaming import Lane

    files = _edge_files(tmp_path / "text")
    d = prepare_stream_corpus(files, CHAR, DataConfig(val_fraction=0.0), cache_root=tmp_path / "cache")
    ref_dir = tmp_path / "tok"
    tokenize_corpus(files, ref_dir, TokenizerConfig(path=str(d / "tokenizer.json"), special_tokens=CHAR.special_tokens),
                    val_fraction=0.0)
    eos = json.loads((d / "meta.json").read_text())["tokenizer"]["special_token_ids"]["eos"]
    expected = token_stream(ref_dir, "train", eos).tolist()
    s = json.loads((d / "meta.json").read_text())["streaming"]
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    for n in [1, 2, 3, 5, 8, 13, 21, 34, 55]:  # cuts land mid-line, on blank lines, between files
        lanes = [Lane(p, tok, eos, None, f"lane {j}") for j, p in enumerate(lane_pieces(s["files"], s["sizes"], s["train_end"], n))]
        assert [t for lane in lanes for t in _epoch(lane)] == expected, n

    got, ranges = [], []
    for rank in range(2):
        stream = TextStream(d, (d / "tokenizer.json").read_text(), eos, 9, 3, rank, 2, 2, _windows)
        for reader in range(2):
            for lane in stream._lanes(reader):
                ranges.append([(p.path, p.start, p.end) for p in lane.pieces])
                got.extend(_epoch(lane))
    assert got == expected
    assert len(ranges) == 12 and all(ranges)
    flat = sorted(r for lane in ranges for r in lane)  # stretches never overlap
    assert all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(flat, flat[1:]))


def test_window_positions_resume_exactly(tmp_path):
    """A lane rebuilt from any saved position continues with exactly the windows the original gives next."""
    files = _edge_files(tmp_path / "text")
    d = prepare_stream_corpus(files, CHAR, DataConfig(val_fraction=0.1), cache_root=tmp_path / "cache")
    tok = json.loads((d / "meta.json").read_text())
    eos = tok["tokenizer"]["special_token_ids"]["eos"]
    stream = TextStream(d, (d / "tokenizer.json").read_text(), eos, 8, 2, 0, 1, 0, _windows)
    original = stream._lanes(0)
    saved, later = [], []
    for step in range(60):  # through several epochs of these small lanes
        windows = [lane.window(8) for lane in original]
        if step in (5, 31):
            saved.append((step, [lane.position() for lane in original]))
        later.append(windows)
    for step, pos in saved:
        stream.positions = [pos]
        resumed = stream._lanes(0)
        assert [[lane.window(8) for lane in resumed] for _ in range(60 - step - 1)] == later[step + 1 :]


def test_stop_and_resume_feeds_the_same_batches_without_rereading(setup, tmp_path, fed):
    recipe, corpus = setup
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"), streaming=True)
    full = digests(fed)
    fed.clear()
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "half"), streaming=True, stop_after=3)
    assert digests(fed) == full[:3]
    saved = _position(tmp_path / "half", 3)["ranks"][0]["positions"][0]
    streaming.reads.clear()
    streaming.reads.bytes = 0
    api.pretrain(out=str(tmp_path / "half"), resume=True)  # resumes streaming: the run config says so
    assert digests(fed) == full  # the same token ids, batch for batch
    # Every lane seeked straight to its saved line and read on from there: nothing consumed was read again.
    assert list(streaming.reads) == [(str(corpus.resolve()), lane[2]) for lane in saved]
    # ... and read at most the unconsumed rest of each lane (plus the line running over its end)
    meta = json.loads((Path(json.loads((tmp_path / "half" / "config.json").read_text())["corpus"]) / "meta.json").read_text())
    ends = [p[-1].end for p in lane_pieces(meta["streaming"]["files"], meta["streaming"]["sizes"],
                                            meta["streaming"]["train_end"], 4)]
    longest = max(map(len, corpus.read_bytes().splitlines(keepends=True)))
    assert 0 < streaming.reads.bytes <= sum(end - lane[2] + longest for end, lane in zip(ends, saved))
    assert _losses(tmp_path / "full") == _losses(tmp_path / "half")
    a = load_file(str(tmp_path / "full" / "model.safetensors"))
    b = load_file(str(tmp_path / "half" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_with_loader_workers(setup, tmp_path, fed):
    """Two readers, one per DataLoader worker, alternate batches; a resume after an odd number restarts at the
    right one, with the workers or without (the main process then serves both readers in turn)."""
    recipe, corpus = setup
    over = ["train.num_workers=2"]
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"), overrides=over, streaming=True)
    batches = list(fed)
    full = digests(batches)
    fed.clear()
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "half"), overrides=over, streaming=True, stop_after=3)
    shutil.copytree(tmp_path / "half", tmp_path / "other")
    assert _position(tmp_path / "half", 3)["ranks"][0]["first"] == 1  # reader 1 owes the next batch
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    assert digests(fed) == full and len(set(full)) == 6
    fed[:] = batches[:3]
    api.pretrain(out=str(tmp_path / "other"), resume=True, overrides=["train.num_workers=0"])
    assert digests(fed) == full
    with pytest.raises(PlmError, match="same process count and micro batch"):
        api.pretrain(out=str(tmp_path / "other"), resume=True, overrides=["train.micro_batch_size=2", "train.max_steps=9"])


def test_streaming_refusals(setup, tmp_path):
    recipe, corpus = setup
    gz = tmp_path / "c.txt.gz"
    gz.write_bytes(__import__("gzip").compress(corpus.read_bytes()))
    with pytest.raises(PlmError, match="cannot be entered midway"):
        api.pretrain(str(recipe), [str(gz)], str(tmp_path / "a"), streaming=True)
    with pytest.raises(PlmError, match=r"\(dynamic masking\), and objective.dynamic is false"):  # bert-mini: static NSP
        api.pretrain("bert-mini", [str(corpus)], str(tmp_path / "b"), streaming=True)
    with pytest.raises(PlmError, match="without word boundaries, so objective.masking wwm"):
        api.pretrain("bert-mini", [str(corpus)], str(tmp_path / "b"), streaming=True,
                     overrides=["objective.dynamic=true", "objective.pairs=none", "objective.masking=wwm"])
    with pytest.raises(PlmError, match="plain token windows .* not TruncatedBPTT"):  # no window_batch seam
        api.pretrain("lstm-ptb-small", [str(corpus)], str(tmp_path / "b"), streaming=True)
    tokenize_corpus([str(corpus)], tmp_path / "tok", CHAR)
    with pytest.raises(PlmError, match="already tokenized"):
        api.pretrain(str(recipe), [str(tmp_path / "tok")], str(tmp_path / "c"), streaming=True)
    for workers in (0, 2):  # from a DataLoader worker too, as the same one-line error
        with pytest.raises(PlmError, match="^streaming lane [0-9]+ found no text") as e:
            api.pretrain(str(recipe), [str(corpus)], str(tmp_path / f"d{workers}"), streaming=True,
                         overrides=["train.global_batch_size=2048", "train.micro_batch_size=1024", "train.max_steps=1",
                                    f"train.num_workers={workers}"])
        assert "too small for this many readers" in e.value.hint and "Traceback" not in str(e.value)
    d = prepare_stream_corpus([str(corpus)], CHAR, DataConfig(), cache_root=tmp_path / "cache")
    with pytest.raises(PlmError, match="add --streaming"):
        token_stream(d, "train", 1)
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "plain"), stop_after=1)
    with pytest.raises(PlmError, match="trained from a tokenized corpus"):  # its data would silently start over
        api.pretrain(out=str(tmp_path / "plain"), resume=True, streaming=True)


BERT_STREAM = """\
extends: bert-mini
model: {n_layer: 1, n_head: 2, d_model: 32, d_ff: 64, max_positions: 64, dropout: 0.0, attn_dropout: 0.0}
tokenizer: {vocab_size: 300, min_frequency: 1}
data: {val_fraction: 0.2}
objective: {dynamic: true, pairs: none, masking: token}
train: {seq_len: 32, global_batch_size: 4, max_steps: 6, eval_every: 6, eval_batches: 2, save_every: 3, log_every: 1}
"""


def test_streaming_masked_lm_masks_each_batch_and_resumes_exactly(tmp_path, monkeypatch):
    """RoBERTa-style pretraining from text streamed as it trains: [CLS] window [SEP] rows masked afresh
    (15%, 80/10/10), the masks a function of the stream position, so a resumed run trains on the same batches."""
    from plmcli.objectives.mlm import MaskedLM

    batches = []
    step = MaskedLM.step

    def recording(self, model, batch, state=None):
        if model.training:
            batches.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})
        return step(self, model, batch, state)

    monkeypatch.setattr(MaskedLM, "step", recording)
    recipe = tmp_path / "bert-stream.yaml"
    recipe.write_text(BERT_STREAM)
    corpus = tiny_corpus(tmp_path / "corpus.txt", n_docs=60)
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"), streaming=True)
    assert s["steps"] == 6 and s["val_ppl"] > 1
    meta = json.loads((Path(json.loads((tmp_path / "full" / "config.json").read_text())["corpus"]) / "meta.json").read_text())
    ids = meta["tokenizer"]["special_token_ids"]
    full = list(batches)
    for b in full:
        x = b["input_ids"]
        assert x.shape == (4, 32) and (x[:, 0] == ids["cls"]).all() and (x[:, -1] == ids["sep"]).all()
        assert not torch.isin(b["mlm_positions"] % 32, torch.tensor([0, 31])).any()  # [CLS]/[SEP] never targets
        assert 0 < len(b["mlm_positions"]) <= 4 * 20
    masked_share = sum(len(b["mlm_positions"]) for b in full) / (6 * 4 * 30)
    assert 0.10 < masked_share < 0.20
    shown = torch.cat([b["input_ids"].flatten()[b["mlm_positions"]] for b in full])
    assert 0.6 < (shown == ids["mask"]).float().mean() < 0.95  # ~80% [MASK]
    batches.clear()
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "half"), streaming=True, stop_after=3)
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    assert len(batches) == 6
    for a, b in zip(full, batches):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(tmp_path / "full") == _losses(tmp_path / "half")


@pytest.mark.distributed
def test_two_processes_read_disjoint_lanes_and_resume(setup, tmp_path):
    """torchrun, 2 CPU processes: rank r streams lanes 2r, 2r+1 of the 4 a 1-process run has (the same
    batches, split), the checkpoint gathers both ranks' positions, and a 2-process resume continues them."""
    recipe, corpus = setup
    over = ["model.dropout=0.0"]
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "one"), overrides=over, streaming=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "plmcli",
              "pretrain", "--out", str(tmp_path / "two")]
    for extra in (["--recipe", str(recipe), "--data", str(corpus), "--streaming", "--stop-after", "3",
                   *[a for o in over for a in ("--set", o)]], ["--resume"]):
        r = subprocess.run(launch + extra, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for step in (3, 6):
        one, two = _position(tmp_path / "one", step), _position(tmp_path / "two", step)
        lanes = one["ranks"][0]["positions"][0]
        assert [rk["positions"][0] for rk in two["ranks"]] == [lanes[:2], lanes[2:]]
    assert _losses(tmp_path / "two") == pytest.approx(_losses(tmp_path / "one"), rel=1e-4)


def test_cli_streaming_and_its_clean_error(setup, tmp_path):
    from typer.testing import CliRunner

    from plmcli.cli import app

    recipe, corpus = setup
    res = CliRunner().invoke(app, ["pretrain", "--recipe", str(recipe), "--data", str(corpus), "--out", str(tmp_path / "r"),
                                   "--streaming", "--max-steps", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout[res.stdout.index("{"):])["tokens"] == 2 * 4 * 16
    res = CliRunner().invoke(app, ["pretrain", "--recipe", "bert-mini", "--data", str(corpus), "--out", str(tmp_path / "b"),
                                   "--streaming"])
    assert res.exit_code == 2 and res.stderr.strip().startswith("error: --streaming masks each batch as it reads")
    assert "\n" not in res.stderr.strip()
