"""The pieces the low-resource benchmark's table is computed from: seeded slices, the scikit-learn baselines
scored by plm's own task code, mean ± std, the plot. (The benchmark itself pretrains for half an hour.)"""

import statistics
from pathlib import Path

import pytest

from benchmarks.quality import low_resource as lr
from benchmarks.quality import low_resource_baselines as lrb

pytestmark = [pytest.mark.bench, pytest.mark.usefixtures("one_thread")]


def test_a_seed_draws_the_same_rows_another_seed_others_and_all_keeps_every_row():
    items = list(range(100))
    a, b = lr._sample(items, "10", 42), lr._sample(items, 10, 42)
    assert a == b and len(set(a)) == 10 and set(a) <= set(items)
    assert lr._sample(items, "10", 1) != a
    assert lr._sample(items, "all", 42) == items


def test_conll_blocks_split_at_blank_lines_and_drop_docstart(tmp_path):
    f = tmp_path / "eng.train"
    f.write_text("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\n\n\nPeter NNP I-NP I-PER\n")
    assert lr._conll_blocks(f) == [["EU NNP I-NP I-ORG", "rejects VBZ I-VP O"], ["Peter NNP I-NP I-PER"]]


def test_word_features_read_the_token_its_shape_affixes_and_two_neighbours_each_side():
    f = lrb.word_features(["Peter", "Blackburn", "said"], 0)
    assert f["word=Peter"] == f["0:lower=peter"] == f["0:shape=Xx"] == f["pre2=Pe"] == f["suf3=ter"] == 1.0
    assert f["-1:lower=<s>"] == f["-2:lower=<s>"] == f["1:lower=blackburn"] == f["2:lower=said"] == 1.0
    assert (f["title"], f["upper"], f["digit"], f["first"]) == (1.0, 0.0, 0.0, 1.0)
    assert lrb.word_features(["in", "1996"], 1)["0:shape=d"] == 1.0  # runs of a character class collapse


def _sst2_dir(root, train, dev):
    d = root / "SST-2"
    d.mkdir(parents=True)
    for name, rows in (("train.tsv", train), ("dev.tsv", dev)):
        (d / name).write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return root


def test_bag_of_words_learns_a_separable_task_through_plms_sst2_reader(tmp_path):
    good, bad = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "dull"]
    train = [(f"a {w} film number {k}", 1) for k in range(6) for w in good]
    train += [(f"a {w} film number {k}", 0) for k in range(6) for w in bad]
    dev = [("the great one", 1), ("the awful one", 0), ("nice and fine", 1), ("dull and poor", 0)]
    assert lrb.bag_of_words("sst2", _sst2_dir(tmp_path, train, dev), seed=0) == 1.0


def test_token_classifier_is_scored_by_plms_seqeval_scorer(tmp_path):
    sents = [[("John", "I-PER"), ("met", "O"), ("Mary", "I-PER"), ("in", "O"), ("Paris", "I-LOC")],
             [("Anna", "I-PER"), ("saw", "O"), ("Rome", "I-LOC")],
             [("the", "O"), ("city", "O"), ("is", "O"), ("Berlin", "I-LOC")]] * 8
    text = "\n\n".join("\n".join(f"{w} X X {t}" for w, t in s) for s in sents) + "\n"
    for name in ("eng.train", "eng.testa"):
        (tmp_path / name).write_text(text)
    assert lrb.token_classifier(tmp_path, seed=0) == 1.0


def test_mean_and_sample_std_as_the_table_shows_them():
    xs = [0.70, 0.74, 0.72]
    assert lr._stats(xs) == pytest.approx((0.72, statistics.stdev(xs)))
    assert lr._fmt(xs) == "0.7200 ± 0.0200" and lr._fmt([0.5]) == "0.5000 ± 0.0000"


def test_plot_writes_a_png_of_every_cell(tmp_path):
    cells = [{"task": "sst2", "rows": r, "n_rows": n, "pretrained": [0.7, 0.72], "random": [0.6, 0.61],
              "sklearn": [0.65, 0.66]} for r, n in (("500", 500), ("1000", 1000))]
    cells += [{"task": t, "rows": "1000", "n_rows": 1000, "pretrained": [0.8], "random": [0.7], "sklearn": []}
              for t in ("chnsenticorp", "conll2003")]
    png = lr.plot(cells, tmp_path / "fig.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_reading_states_the_goal_from_the_means_and_every_cells_gain():
    probe = {"pretrained": [0.60, 0.62], "random": [0.55, 0.56]}
    cell = {"task": "sst2", "rows": "1000", "n_rows": 1000, "sklearn": [0.68, 0.70]}
    met = lr.reading([{**cell, "pretrained": [0.76, 0.74], "random": [0.69, 0.69]}], probe, 42)
    assert "**met** — 0.7500 vs 0.6900 (+6.0 points) and 0.6900 (+6.0)" in met
    assert "SST-2 1,000 +6.0" in met and "best 0.620 vs 0.560" in met
    missed = lr.reading([{**cell, "pretrained": [0.73], "random": [0.69]}], probe, 42)  # +4 points: not enough
    assert "**NOT met**" in missed
    conll = {"task": "conll2003", "rows": "1000", "n_rows": 1000, "sklearn": [0.69], "pretrained": [0.72], "random": [0.6]}
    both = lr.reading([{**cell, "pretrained": [0.73], "random": [0.69]}, conll], probe, 42)
    assert "SST-2 **NOT met**" in both and "CoNLL-2003 NER **met** — 0.7200 vs 0.6000 (+12.0 points)" in both
    assert lr._points(0.7, 0.65) == "+5.0" and lr._points(float("nan"), 0.6) == "–"


def test_a_pretraining_row_counts_what_was_read_loop_steps_or_word2vec_epochs():
    loop = {"summary": {"steps": 100, "tokens": 204_800, "elapsed_s": 10.0, "val_ppl": 223.29}, "corpus_mb": 5.83,
            "cpu_s": 600.0, "wall": 630.0}
    assert lr.pretrain_row("en", loop) == ["en", "5.8 MB", "100", "204,800", "20,480", "10.0 min", "10.5 min", "223.3"]
    w2v = {"summary": {"steps": 0, "epochs": 20, "tokens": 1_000, "elapsed_s": 4.0}, "corpus_mb": 0.01,
           "cpu_s": 6.0, "wall": 6.0}
    assert lr.pretrain_row("en", w2v)[2:5] == ["20 epochs", "20,000", "5,000"] and lr.pretrain_row("en", w2v)[-1] == "–"


def test_set_overrides_reach_every_language_or_the_one_they_name():
    from types import SimpleNamespace

    args = SimpleNamespace(overrides=["model.dim=50", "zh:model.window=20", "en:model.epochs=3"])
    assert lr._user_overrides(args, "zh") == ["model.dim=50", "model.window=20"]
    assert lr._user_overrides(args, "en") == ["model.dim=50", "model.epochs=3"]
    # a key=value whose value holds a colon is not a language prefix
    assert lr._user_overrides(SimpleNamespace(overrides=["data.path=a:b"]), "en") == ["data.path=a:b"]


def test_the_section_names_the_command_that_made_the_figures_not_the_report_stage():
    import argparse

    args = argparse.Namespace(argv=["low-resource", "--keep", "D", "--stage", "report", "--preliminary"], recipe="r")
    shown = lr.making_command(args)
    assert shown.argv == ["low-resource", "--keep", "D", "--preliminary"] and shown.recipe == "r"
    assert lr.making_command(argparse.Namespace(argv=["--stage=report", "--keep", "D"])).argv == ["--keep", "D"]
    # another stage stays: it is part of what was run
    assert lr.making_command(argparse.Namespace(argv=["--stage", "finetune"])).argv == ["--stage", "finetune"]
    assert args.argv[3:5] == ["--stage", "report"]  # the caller's args untouched


def test_chinese_rows_add_chnsenticorp_cells_after_every_1000_row_cell(tmp_path, monkeypatch):
    import argparse

    monkeypatch.setattr(lr, "make_slice", lambda root, task, rows, seed: tmp_path / f"{task}-{rows}-{seed}")
    args = argparse.Namespace(rows="1000,500,all", chinese_rows="250,1000,all", threads=2, jobs=2, all_epochs=1,
                              max_steps=None)
    jobs = lr.finetune_jobs(args, tmp_path, ["sst2", "chnsenticorp", "conll2003"], [42])
    cells = [(j["name"], j["rows"]) for j in jobs if j["init"] == "pretrained"]
    assert cells == [("sst2", "1000"), ("conll2003", "1000"), ("chnsenticorp", "1000"), ("sst2", "500"),
                     ("chnsenticorp", "250"), ("sst2", "all"), ("chnsenticorp", "all")]
    assert all(j["task"] == "classification" for j in jobs if j["name"] == "chnsenticorp")
    # --all-epochs is SST-2's 67k rows' setting; all 9,600 reviews keep the size defaults
    assert {(j["name"], j["epochs"]) for j in jobs if j["rows"] == "all"} == {("sst2", 1), ("chnsenticorp", None)}


def test_plot_draws_chnsenticorp_as_a_curve_when_it_has_several_row_counts(tmp_path):
    cells = [{"task": t, "rows": r, "n_rows": int(r), "pretrained": [0.7, 0.72], "random": [0.6, 0.61],
              "sklearn": [0.65, 0.66]} for t in ("sst2", "chnsenticorp") for r in ("500", "1000")]
    cells.append({"task": "conll2003", "rows": "1000", "n_rows": 1000, "pretrained": [0.7], "random": [0.5],
                  "sklearn": [0.69]})
    png = lr.plot(cells, tmp_path / "fig.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_all_rows_cell_counts_the_rows_of_its_tasks_own_training_file(tmp_path, monkeypatch):
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "train.tsv").write_text("sentence\tlabel\na\t1\nb\t0\nc\t1\n", encoding="utf-8")
    (tmp_path / "train.tsv").write_text("label\ttext_a\n1\t好\n0\t差\n", encoding="utf-8")
    monkeypatch.setattr(lr, "make_slice", lambda root, task, rows, seed: tmp_path)
    assert lr._row_count(tmp_path, "sst2", "all", 42) == 3
    assert lr._row_count(tmp_path, "chnsenticorp", "all", 42) == 2
    assert lr._row_count(tmp_path, "chnsenticorp", "500", 42) == 500


def test_an_interrupted_finetune_starts_over_and_a_finished_one_is_read_back(tmp_path, monkeypatch):
    ran = []

    def worker(module, job, env):
        ran.append(job["out"])
        assert not Path(job["out"]).exists()  # the leftovers of the interrupted run are gone first
        return {"dev": {"accuracy": 0.7}}

    monkeypatch.setattr(lr.common, "run_worker", worker)
    half, done = tmp_path / "ft" / "half", tmp_path / "ft" / "done"
    (half / "checkpoints").mkdir(parents=True)
    done.mkdir()
    (tmp_path / "ft" / "done.json").write_text('{"dev": {"accuracy": 0.9}}')
    jobs = [{"kind": "finetune", "out": str(d), "done": str(d.parent / f"{d.name}.json")} for d in (half, done)]
    got = lr.run_jobs(jobs, 1, {})
    assert ran == [str(half)] and [g["dev"]["accuracy"] for g in got] == [0.7, 0.9]
