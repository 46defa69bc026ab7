"""`plm plot`: training curves of real tiny runs, checked through the Figure and the PNG it becomes."""

import json
import shutil
import struct

import pytest
from typer.testing import CliRunner

from helpers import tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.analysis.plot import make_figure, plot_runs, read_metrics
from plmcli.cli import app
from plmcli.errors import PlmError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny GPT runs (6 steps, eval every 3) that differ in their learning rate."""
    root = tmp_path_factory.mktemp("plot")
    recipe, corpus = tiny_recipe(root / "tiny.yaml"), tiny_corpus(root / "c.txt")
    api.pretrain(str(recipe), [str(corpus)], str(root / "run-a"))
    api.pretrain(str(recipe), [str(corpus)], str(root / "run-b"), overrides=["optim.lr=1e-3"])
    return root / "run-a", root / "run-b"


def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_one_run(runs):
    run = runs[0]
    train = [r for r in rows(run) if "loss" in r]
    evals = [r for r in rows(run) if "val_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6] and [r["step"] for r in evals] == [3, 6]

    data = [read_metrics(run)]
    fig = make_figure(data, ["loss", "val_loss", "val_ppl", "lr"])
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["training loss", "validation loss", "validation perplexity", "learning rate"]
    assert [ax.get_ylabel() for ax in axes] == ["loss", "val_loss", "val_ppl", "lr"]
    assert {ax.get_xlabel() for ax in axes} == {"optimizer step"}
    assert fig._suptitle.get_text() == "run-a"
    (loss,), (val,), _, (lr,) = (ax.get_lines() for ax in axes)
    assert list(loss.get_xdata()) == [1, 2, 3, 4, 5, 6] and list(loss.get_ydata()) == [r["loss"] for r in train]
    assert list(val.get_xdata()) == [3, 6] and list(val.get_ydata()) == [r["val_loss"] for r in evals]
    assert list(lr.get_ydata()) == [r["lr"] for r in train] and axes[3].get_yscale() == "linear"

    res = plot_runs([str(run)])  # default: loss, every val_* logged, lr
    out = run / "plots.png"
    assert res["out"] == str(out) and res["metrics"] == ["loss", "val_loss", "val_ppl", "lr"] and res["skipped_lines"] == {}
    width, height = png_size(out)
    assert 900 < width < 1400 and 600 < height < 1000  # 2 × 2 panels of 5 × 3.4 in at 110 dpi
    assert 20_000 < out.stat().st_size < 1_000_000
    assert not list(run.glob(".plots.png.tmp*"))


def test_two_runs_overlaid_by_tokens(runs, tmp_path, monkeypatch):
    data = [read_metrics(r) for r in runs]
    fig = make_figure(data, ["loss", "val_loss"], x="tokens")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["run-a", "run-b"]
    ax = fig.axes[0]
    assert ax.get_xlabel() == "training tokens"
    a, b = ax.get_lines()
    assert list(a.get_xdata()) == [r["tokens"] for r in rows(runs[0]) if "loss" in r]
    assert list(b.get_ydata()) == [r["loss"] for r in rows(runs[1]) if "loss" in r]

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["plot", str(runs[0]), str(runs[1]), "--metrics", "loss,val_loss", "--x", "tokens"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "wrote plm-plot.png (loss, val_loss by tokens; 2 runs)"
    assert png_size(tmp_path / "plm-plot.png")[0] > 800


def test_same_directory_names_and_resumed_steps(tmp_path):
    # Two runs both called "pretrain"; the second was resumed from step 2 and logged steps 3-4 again.
    for parent, lines in (("x", [{"step": s, "tokens": 8 * s, "loss": 10.0 / s, "lr": 1e-3} for s in (1, 2, 3, 4)]),
                          ("y", [{"step": s, "tokens": 8 * s, "loss": v, "lr": 1e-3}
                                 for s, v in ((1, 5.0), (2, 4.0), (3, 9.0), (4, 9.0), (3, 3.0), (4, 2.0))])):
        (tmp_path / parent / "pretrain").mkdir(parents=True)
        (tmp_path / parent / "pretrain" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    res = plot_runs([str(tmp_path / "x" / "pretrain"), str(tmp_path / "y" / "pretrain")], out=str(tmp_path / "p.png"))
    assert res["runs"] == ["x/pretrain", "y/pretrain"] and res["metrics"] == ["loss", "lr"]
    y = read_metrics(tmp_path / "y" / "pretrain")
    assert y.series("loss", "step") == ([1, 2, 3, 4], [5.0, 4.0, 3.0, 2.0])  # the resumed rows win
    fig = make_figure([read_metrics(tmp_path / "x" / "pretrain"), y], ["loss"])
    assert fig.axes[0].get_yscale() == "log"  # 10 → 2.5 spans 4×


def test_malformed_lines_are_skipped_and_counted(runs, tmp_path):
    run = tmp_path / "partial"
    run.mkdir()
    good = (runs[0] / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text("not json\n" + good + "[1, 2]\n" + good.splitlines()[0][:20] + "\n")
    res = CliRunner().invoke(app, ["plot", str(run)])
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == "warning: skipped 3 malformed lines of partial/metrics.jsonl"
    assert read_metrics(run).series("loss", "step") == read_metrics(runs[0]).series("loss", "step")
    assert png_size(run / "plots.png")[0] > 800


def test_bad_input(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PlmError, match="has no metrics.jsonl"):
        plot_runs([str(empty)])
    with pytest.raises(PlmError, match="is not a directory"):
        plot_runs([str(tmp_path / "missing")])
    (tmp_path / "phased" / "phases" / "p1").mkdir(parents=True)
    shutil.copy(runs[0] / "metrics.jsonl", tmp_path / "phased" / "phases" / "p1")
    with pytest.raises(PlmError, match="one per phase: pass .*phases/p1"):
        plot_runs([str(tmp_path / "phased")])
    (empty / "metrics.jsonl").write_text("garbage\n")
    with pytest.raises(PlmError, match=r"no metric rows \(1 malformed lines\)"):
        plot_runs([str(empty)])
    with pytest.raises(PlmError) as e:
        plot_runs([str(runs[0])], metrics=["loss", "val_acc"], out=str(tmp_path / "never.png"))
    assert "no run has metric 'val_acc'" in str(e.value) and "available: grad_norm, loss, lr, tok_per_s, val_loss" in str(e.value)
    assert not (tmp_path / "never.png").exists()

    runner = CliRunner()
    assert "Example: plm plot" in runner.invoke(app, ["plot", "--help"]).output
    for args, needle in ((["--x", "time"], "--x 'time' is not an x axis — one of: step, tokens"),
                         (["--out", str(tmp_path / "a.jpg")], "is not a .png file"),
                         (["--metrics", "nope"], "no run has metric 'nope'")):
        res = runner.invoke(app, ["plot", str(runs[0]), *args])
        assert res.exit_code == 2 and res.stderr.startswith("error: ") and "\n" not in res.stderr.strip(), res.output
        assert needle in res.stderr
