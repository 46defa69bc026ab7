"""train.report_to: every metrics.jsonl row also goes to accelerate's trackers (TensorBoard, MLflow, W&B), read back
here from what each tracker wrote."""

import json

import pytest

from helpers import finetune, tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.config import TrainConfig, load_recipe
from plmcli.errors import PlmError
from test_finetune import SAMPLE, families, tokenizer, toy_run  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny(tmp_path):
    return str(tiny_recipe(tmp_path / "tiny.yaml")), str(tiny_corpus(tmp_path / "corpus.txt"))


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _series(rows) -> dict:
    """metrics.jsonl as tag -> [(step, value)]: the numbers of each row, the step aside."""
    out: dict = {}
    for r in rows:
        for k, v in r.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(k, []).append((r["step"], float(v)))
    return out


def _events(folder) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag


def test_tensorboard_gets_every_row_of_metrics_jsonl(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    api.pretrain(tiny[0], [tiny[1]], str(run), overrides={"train.report_to": "tensorboard"})
    rows = _rows(run)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]  # metrics.jsonl as it always was
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1  # RUN/tb/ as before
    _same(_events(run / "tb"), _series(rows))
    assert {"loss", "lr", "val_loss", "tokens"} <= set(_events(run / "tb"))
    assert list((run / "tb").rglob("hparams.yml"))  # the recipe's train/optim settings, as the run's config


def test_mlflow_gets_every_row_and_the_run_is_named_after_its_directory(tiny, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3: the file store is opt-in
    run = tmp_path / "my-run"
    api.pretrain(tiny[0], [tiny[1]], str(run), overrides=["train.report_to=mlflow"])
    assert not (run / "tb").exists()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("my-run")
    [found] = client.search_runs([exp.experiment_id])
    assert found.info.run_name == "my-run" and found.info.status == "FINISHED"
    assert found.data.params["train.max_steps"] == "6" and found.data.params["optim.schedule"] == "cosine"
    want = _series(_rows(run))
    got = {k: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, k)] for k in found.data.metrics}
    _same(got, want)


def test_wandb_offline(tiny, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    api.pretrain(tiny[0], [tiny[1]], str(run), overrides={"train.report_to": ["wandb"]})
    assert list(run.rglob("*.wandb"))


def test_report_to_none_writes_no_events(tiny, tmp_path):
    run = tmp_path / "run"
    api.pretrain(tiny[0], [tiny[1]], str(run), overrides=["train.report_to=none", "train.max_steps=2"])
    assert not (run / "tb").exists() and not list(run.rglob("events.out.tfevents.*"))
    assert [r["step"] for r in _rows(run) if "loss" in r] == [1, 2]


def test_report_to_values(tiny):
    assert load_recipe(tiny[0], ["train.report_to=tensorboard,mlflow"]).train.report_to == ["tensorboard", "mlflow"]
    assert load_recipe(tiny[0], {"train.report_to": ["mlflow", "aim"]}).train.report_to == ["mlflow", "aim"]
    pytest.importorskip("tensorboard")
    assert TrainConfig().report_to == ["tensorboard"]  # the default where tensorboard is installed


@pytest.mark.parametrize("value", ["tensorbord", "tensorboard,tensorboard", "none,mlflow", "[wandb, comet]"])
def test_a_bad_value_is_one_line_naming_the_key(tiny, value):
    with pytest.raises(PlmError) as e:
        load_recipe(tiny[0], [f"train.report_to={value}"])
    assert str(e.value).startswith("train.report_to ") and "\n" not in str(e.value)
    assert "tensorboard, wandb, mlflow or aim" in str(e.value)


def test_a_missing_tracker_package_stops_before_training(tiny, tmp_path, monkeypatch):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find(name, *a))
    with pytest.raises(PlmError) as e:
        api.pretrain(tiny[0], [tiny[1]], str(tmp_path / "run"), overrides=["train.report_to=mlflow"])
    assert str(e.value) == "train.report_to mlflow needs the mlflow package — pip install 'plm[trackers]' (or mlflow-skinny)"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_finetune_reports_too(toy_run, tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "ft"
    finetune("sst2", from_run=str(toy_run), data_dir=str(SAMPLE), out=str(out), train__max_steps=2, train__epochs=1,
             optim__lr=3e-2, train__report_to="tensorboard")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows
    _same(_events(out / "tb"), _series(rows))
