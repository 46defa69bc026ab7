"""`plm finetune` over a grid (Devlin et al.'s protocol): --lr/--epochs/--batch-size lists and --seeds, each run
a complete finetune in OUT/grid/, the best dev run kept as OUT, grid.json / grid.md with mean ± std over seeds.

Tiny runs: the tiny GPT of tests/helpers.py finetuned GPT-style on the shipped SST-2 sample for 2 steps.
"""

import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import assert_clean_error, dirs_under, finetune, run, tiny_gpt_run
from plm_process import env_for, plm_cmd
from plmcli.pipelines.finetune_grid import summarise

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "glue-sample"


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    with dirs_under(root):
        return tiny_gpt_run(root)


def args(gpt, out, *more):
    return ["finetune", "--task", "sst2", "--data-dir", SAMPLE, "--from", gpt, "--out", out, "--max-seq-len", 16,
            "--max-steps", 2, *more]


def ok_json(res) -> dict:
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


@pytest.fixture(scope="module")
def grid(gpt, tmp_path_factory):
    """The grid of the issue: two learning rates × two seeds, 2 steps each."""
    out = tmp_path_factory.mktemp("grid") / "out"
    with dirs_under(out.parent):
        res = run(*args(gpt, out, "--lr", "1e-3,1e-4", "--seeds", 2, "--json"))
    return out, ok_json(res), res


def cell_metrics(out: Path, name: str) -> dict:
    return json.loads((out / "grid" / name / "metrics.json").read_text())


def test_summary_by_hand():
    runs = [{"lr": 1e-3, "epochs": 3, "batch_size": 32, "seed": s, "metric": m} for s, m in ((1, 0.5), (2, 0.75))]
    runs += [{"lr": 1e-4, "epochs": 3, "batch_size": 32, "seed": 1, "metric": 0.875}]
    settings, best = summarise(runs)
    assert best == 2 and [s["best"] for s in settings] == [False, True]
    assert settings[0]["metric"] == [0.5, 0.75] and settings[0]["mean"] == 0.625
    assert settings[0]["std"] == pytest.approx(math.sqrt(((0.5 - 0.625) ** 2 + (0.75 - 0.625) ** 2) / 1))
    assert settings[1]["mean"] == 0.875 and settings[1]["std"] is None  # one seed: no spread
    # equals: the first in grid order is the best
    assert summarise([{**runs[0], "metric": 0.5}, {**runs[1], "metric": 0.5}])[1] == 0


def test_a_grid_runs_every_cell_and_keeps_the_best_as_out(grid, gpt, tmp_path):
    out, res, cli = grid
    # epochs left to the backbone's size (pipelines.finetune.size_defaults): "auto" in the name, the resolved number in grid.json
    names = ["0.001-auto-32-seed42", "0.001-auto-32-seed43", "0.0001-auto-32-seed42", "0.0001-auto-32-seed43"]
    assert sorted(p.name for p in (out / "grid").iterdir()) == sorted(names)
    saved = json.loads((out / "grid.json").read_text())
    assert saved == res and len(saved["runs"]) == 4 and saved["main_metric"] == "accuracy"
    assert [r["dir"] for r in saved["runs"]] == [f"grid/{n}" for n in names]
    assert [r["epochs"] for r in saved["runs"]] == [3] * 4  # --max-steps: the size defaults keep 3 epochs
    acc = [cell_metrics(out, n)["dev"]["accuracy"] for n in names]
    assert [r["metric"] for r in saved["runs"]] == acc
    # mean ± sample std per setting, by hand from the runs' own metrics.json
    for row, pair in zip(saved["settings"], (acc[:2], acc[2:])):
        mean = (pair[0] + pair[1]) / 2
        assert row["metric"] == pair and row["mean"] == pytest.approx(mean)
        assert row["std"] == pytest.approx(math.sqrt((pair[0] - mean) ** 2 + (pair[1] - mean) ** 2))
    best = max(range(4), key=lambda i: acc[i])  # the first of equals
    assert saved["best"]["dir"] == f"grid/{names[best]}" and saved["dev"] == cell_metrics(out, names[best])["dev"]
    # OUT is the best run: its weights and predictions byte for byte, its metrics.json pointing at the grid
    for f in ("model.safetensors", "config.json", "SST-2.tsv", "finetune.yaml", "tokenizer.json"):
        assert (out / f).read_bytes() == (out / "grid" / names[best] / f).read_bytes(), f
    top = json.loads((out / "metrics.json").read_text())
    assert top["dev"] == saved["dev"] and top["out_dir"] == str(out) and top["grid"]["run"] == f"grid/{names[best]}"
    # the table: printed, and written as Markdown with the best starred
    md = (out / "grid.md").read_text()
    assert "| lr | epochs | batch | seed 42 | seed 43 | mean ± std (accuracy) |" in md and md.count(" * ") == 1
    assert "mean ± std" in cli.stderr and "grid ━" in cli.stderr
    assert not yaml.safe_load((out / "finetune.yaml").read_text()).get("grid")  # one run's config, no grid
    # --eval-only takes OUT as one finetuned run
    again = ok_json(run("finetune", "--task", "sst2", "--data-dir", SAMPLE, "--from", out, "--eval-only",
                        "--out", tmp_path / "ev", "--max-seq-len", 16, "--json"))
    assert again["dev"]["accuracy"] == pytest.approx(saved["dev"]["accuracy"])


def test_one_value_is_todays_finetune_and_a_cell_is_one(grid, gpt, tmp_path):
    out, res, _ = grid
    single = ok_json(run(*args(gpt, tmp_path / "one", "--lr", "1e-3", "--seed", 43, "--seeds", 1, "--json")))
    assert {p.name for p in (tmp_path / "one").iterdir()} - {"tb"} == {  # tb/: where tensorboard is installed
        "SST-2.tsv", "config.json", "data", "finetune.yaml", "metrics.json", "metrics.jsonl", "model.safetensors",
        "tokenizer.json"}
    assert "grid" not in yaml.safe_load((tmp_path / "one" / "finetune.yaml").read_text())
    cell = cell_metrics(out, "0.001-auto-32-seed43")  # the same finetune, inside the grid
    for key in ("dev", "history", "train_loss", "steps", "settings"):
        assert single[key] == cell[key], key
    assert (tmp_path / "one" / "finetune.yaml").read_text() == (out / "grid" / "0.001-auto-32-seed43" / "finetune.yaml").read_text()


@pytest.mark.parametrize("bad, says", [
    (["--lr", "1e-4,abc"], "--lr '1e-4,abc' is not a number or a comma-separated list of numbers"),
    (["--seeds", "0"], "--seeds 0 is out of range"),
    (["--epochs", "2,x"], "--epochs '2,x' is not"),
    (["--lr", "1e-3,1e-3"], "--lr lists 0.001 twice"),
    (["--batch-size", "16,0"], "--batch-size 0 is out of range"),
    (["--lr", "1e-4,1.0000001e-4"], "has values equal to 6 digits"),  # they would share a run directory
    (["--set", "grid.lr=[1e-3,-1]"], "grid.lr [0.001, -1.0] must be distinct learning rates > 0"),
    (["--epochs", "2,3"], "every run would stop at step 2"),
    (["--lr", "1e-3,1e-4", "--eval-only"], "not a grid of 2"),
])
def test_bad_lists_are_one_line_and_write_nothing(gpt, tmp_path, bad, says):
    assert_clean_error(run(*args(gpt, tmp_path / "out", *bad)), says)
    assert not (tmp_path / "out").exists()


def test_a_stopped_grid_keeps_its_finished_runs_and_the_same_command_finishes_it(grid, gpt, tmp_path, monkeypatch):
    import plmcli.pipelines.finetune_grid as fg

    full = grid[1]
    out, calls, real = tmp_path / "g", [], fg.run_finetune

    def stop_second(*a, **k):
        calls.append(a[1])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(fg, "run_finetune", stop_second)
    cmd = args(gpt, out, "--lr", "1e-3,1e-4", "--json")
    res = run(*cmd)
    assert res.exit_code == 130 and res.stderr.strip().splitlines()[-1] == (
        f"interrupted — the grid stopped in run 2 of 2; its 1 finished run stays in {out / 'grid'} — the same "
        f"command with --out {out} finetunes only the rest")
    assert [p.name for p in (out / "grid").iterdir()] == ["0.001-auto-32-seed42"] and not (out / "metrics.json").exists()
    monkeypatch.undo()
    done = ok_json(run(*cmd))  # the first run is taken back, the second finetuned; both as the full grid's
    assert [r["reused"] for r in done["runs"]] == [True, False]
    by_dir = {r["dir"]: r["metric"] for r in full["runs"]}
    assert all(by_dir[r["dir"]] == r["metric"] for r in done["runs"])
    # after a kill -9 a run has no metrics.json: it is finetuned again from scratch
    (out / "grid" / "0.0001-auto-32-seed42" / "metrics.json").unlink()
    assert [r["reused"] for r in ok_json(run(*cmd))["runs"]] == [True, False]
    # another grid into the same OUT is refused
    assert_clean_error(run(*args(gpt, out, "--lr", "1e-3,1e-5")), "holds another grid")


def test_a_stop_in_the_first_run_leaves_nothing(gpt, tmp_path, monkeypatch):
    import plmcli.pipelines.finetune_grid as fg

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(fg, "run_finetune", stop)
    res = run(*args(gpt, tmp_path / "g", "--lr", "1e-3,1e-4"))
    assert res.exit_code == 130 and "before any finished" in res.stderr and not (tmp_path / "g").exists()


def test_a_config_file_holds_a_grid_and_a_flag_beats_it(gpt, tmp_path):
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump({"task": {"name": "sst2"}, "train": {"max_steps": 1},
                                                        "grid": {"lr": ["1e-3", 1e-4], "seeds": 1}}))
    common = ["--config", tmp_path / "grid.yaml", "--data-dir", SAMPLE, "--from", gpt, "--max-seq-len", 16, "--json"]
    res = ok_json(run("finetune", *common, "--out", tmp_path / "g"))
    assert [(r["lr"], r["seed"]) for r in res["runs"]] == [(1e-3, 42), (1e-4, 42)]
    written = yaml.safe_load((tmp_path / "g" / "grid.yaml").read_text())
    assert written["grid"]["lr"] == [1e-3, 1e-4] and written["model"]["from_run"] == str(gpt.resolve())

    lib = finetune("sst2", grid__lr=[1e-3, 1e-4], from_run=str(gpt), data_dir=str(SAMPLE), task__max_seq_len=16, train__max_steps=1, out=str(tmp_path / "lib"))
    assert [r["dev"] for r in lib["runs"]] == [r["dev"] for r in res["runs"]] and lib["best"]["dir"] == res["best"]["dir"]
    one = ok_json(run("finetune", *common, "--lr", "1e-4", "--out", tmp_path / "one"))  # the flag: one lr, no grid
    assert one["settings"]["lr"] == 1e-4 and not (tmp_path / "one" / "grid.json").exists()
    assert one["dev"] == res["runs"][1]["dev"]


@pytest.mark.e2e
def test_a_grid_in_a_real_process(gpt, tmp_path):
    proc = subprocess.run(plm_cmd(*args(gpt, tmp_path / "g", "--lr", "1e-3,1e-4", "--max-steps", 1)),
                          capture_output=True, text=True, env=env_for(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{tmp_path / 'g'}: 2 sst2 finetunes; best lr ")
    assert "grid 2/2" in proc.stderr and "mean ± std (accuracy)" in proc.stderr
    assert (tmp_path / "g" / "grid.md").is_file() and (tmp_path / "g" / "metrics.json").is_file()
