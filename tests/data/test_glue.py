"""GLUE readers on the real files (when ../shared/data is present) and on hand-made files in every layout."""

import itertools

import numpy as np
import pytest

from plmcli.config_sections import TokenizerConfig
from plmcli.data.tasks import encode_pairs, truncate_pair
from plmcli.data.tasks.registry import TASKS, get_task
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError

REAL = {  # task: (train, dev, test) rows, per ../shared/data/SOURCES.md
    "sst2": (67349, 872, 1821),
    "cola": (8551, 1043, 1063),
    "mrpc": (3668, 408, 1725),
    "rte": (2490, 277, 3000),
    "stsb": (5749, 1500, 1379),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_glue_files(shared_data, name):
    task = get_task(name)
    splits = task.load(str(shared_data / "glue"))
    assert tuple(len(splits[s]) for s in ("train", "dev", "test")) == REAL[name]
    for s in ("train", "dev"):
        labels = [e.label for e in splits[s]]
        if name == "stsb":
            assert all(isinstance(v, float) and 0 <= v <= 5 for v in labels)
        else:
            assert set(labels) == {0, 1}
    assert all(e.label is None for e in splits["test"])
    assert [e.id for e in splits["test"][:3]] == ["0", "1", "2"]
    pair = name in ("mrpc", "rte", "stsb")
    assert all((e.text_b is not None) == pair and e.text_a for e in splits["train"])


def test_real_quirks(shared_data):
    glue = shared_data / "glue"
    # MRPC: the BOM before `Quality` does not hide the label column; quotes stay as text.
    mrpc = get_task("mrpc").load(str(glue / "MRPC"))  # the task folder itself also works
    first = mrpc["train"][0]
    assert first.label == 1 and first.text_a.startswith("Amrozi accused") and '"the witness"' in first.text_a
    # CoLA: headerless train/dev (source, label, original label, sentence), a header on test.
    cola = get_task("cola").load(str(glue))
    assert cola["train"][0].text_a.startswith("Our friends won't buy") and cola["train"][0].label == 1
    assert cola["test"][0].text_a == "Bill whistled past the house."
    # RTE: string labels in GLUE's order (entailment = 0).
    rte = get_task("rte").load(str(glue))
    assert rte["dev"][0].label == 1  # not_entailment
    stsb = get_task("stsb").load(str(glue))
    assert stsb["train"][0].label == 5.0 and stsb["train"][1].label == pytest.approx(3.8)


def write(path, lines, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")


def test_qqp_layout(tmp_path):
    d = tmp_path / "glue" / "qqp"  # folder names match case-insensitively
    head = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    write(d / "train.tsv", [head, "0\t1\t2\tHow old?\tWhat age?\t1", "1\t3\t4\tWhy?\tWhere?\t0", "2\t5\t6\tcut row"])
    write(d / "dev.tsv", [head, "5\t1\t2\tA?\tB?\t0"])
    write(d / "test.tsv", ["id\tquestion1\tquestion2", "0\tC?\tD?", "1\tE?\tF?"])
    task = get_task("qqp")
    s = task.load(str(tmp_path / "glue"))
    assert task.skipped == {str(d / "train.tsv"): 1}  # QQP's cut rows are skipped and counted
    assert [(e.text_a, e.text_b, e.label) for e in s["train"]] == [("How old?", "What age?", 1), ("Why?", "Where?", 0)]
    assert [e.id for e in s["test"]] == ["0", "1"] and s["test"][1].text_b == "F?"


def test_mnli_layout(tmp_path):
    d = tmp_path / "MNLI"
    cols = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2"
    row = "7\t1\t1a\tgov\t( x )\t( y )\t(X)\t(Y)\tThe premise.\tThe hypothesis."
    write(d / "train.tsv", [cols + "\tlabel1\tgold_label", row + "\tneutral\tneutral"])
    for name in ("dev_matched", "dev_mismatched"):
        write(d / f"{name}.tsv", [cols + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
                                  row + "\tcontradiction\tneutral\tcontradiction\tcontradiction\tcontradiction\tcontradiction"])
    write(d / "test_matched.tsv", [cols, row])
    s = get_task("mnli").load(str(tmp_path))
    assert set(s) == {"train", "dev", "dev_mismatched", "test"}  # test_mismatched and AX absent: skipped
    assert s["train"][0].label == 1 and s["dev_mismatched"][0].label == 2  # entailment, neutral, contradiction
    assert (s["test"][0].text_a, s["test"][0].text_b, s["test"][0].id) == ("The premise.", "The hypothesis.", "7")


def test_qnli_and_wnli_layouts(tmp_path):
    write(tmp_path / "QNLI" / "train.tsv", ["index\tquestion\tsentence\tlabel", "0\tWho?\tHe did.\tentailment",
                                           "1\tWhen?\tBlue.\tnot_entailment"])
    write(tmp_path / "QNLI" / "dev.tsv", ["index\tquestion\tsentence\tlabel", "0\tWho?\tShe.\tentailment"])
    s = get_task("qnli").load(str(tmp_path))
    assert [e.label for e in s["train"]] == [0, 1] and s["train"][0].text_a == "Who?"
    write(tmp_path / "WNLI" / "train.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\t1", "1\tC.\tD.\t0"])
    write(tmp_path / "WNLI" / "dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\t1"])
    s = get_task("wnli").load(str(tmp_path / "WNLI"))
    assert [e.label for e in s["train"]] == [1, 0]
    assert get_task("wnli").format_prediction(1) == "1" and get_task("qnli").format_prediction(1) == "not_entailment"


def test_bom_headerless_cola_and_crlf(tmp_path):
    d = tmp_path / "CoLA"
    write(d / "train.tsv", ["gj04\t1\t\tGood sentence .\r", "gj04\t0\t*\tBad sentence good .\r"], bom=True)
    write(d / "dev.tsv", ["source\tlabel\tx\tsentence", "gj04\t1\t\tFine ."])  # a header is fine too
    s = get_task("cola").load(str(tmp_path))
    assert [(e.text_a, e.label) for e in s["train"]] == [("Good sentence .", 1), ("Bad sentence good .", 0)]
    assert s["dev"][0].text_a == "Fine ." and "test" not in s
    write(tmp_path / "MRPC" / "train.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", '1\t1\t2\t"Quoted\tplain'], bom=True)
    write(tmp_path / "MRPC" / "dev.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "0\t1\t2\tx\ty"], bom=True)
    e = get_task("mrpc").load(str(tmp_path))["train"][0]
    assert (e.text_a, e.text_b, e.label) == ('"Quoted', "plain", 1)


def test_bad_label_names_file_line_and_valid_labels(tmp_path):
    write(tmp_path / "RTE" / "train.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment", "1\ta\tb\tmaybe"])
    write(tmp_path / "RTE" / "dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment"])
    with pytest.raises(PlmError) as e:
        get_task("rte").load(str(tmp_path))
    msg = str(e.value)
    assert "RTE/train.tsv line 3" in msg and "'maybe'" in msg and "entailment, not_entailment" in msg
    write(tmp_path / "SST-2" / "train.tsv", ["sentence\tlabel", "ok\t2"])
    write(tmp_path / "SST-2" / "dev.tsv", ["sentence\tlabel", "ok\t1"])
    with pytest.raises(PlmError, match="line 2: label '2' is not a SST-2 label.*valid labels: 0, 1"):
        get_task("sst2").load(str(tmp_path))
    write(tmp_path / "STS-B" / "train.tsv", ["sentence1\tsentence2\tscore", "a\tb\t7.5"])
    write(tmp_path / "STS-B" / "dev.tsv", ["sentence1\tsentence2\tscore", "a\tb\t1"])
    with pytest.raises(PlmError, match="score '7.5' is not a number in \\[0, 5\\]"):
        get_task("stsb").load(str(tmp_path))


def test_missing_split_and_wrong_columns(tmp_path):
    write(tmp_path / "SST-2" / "train.tsv", ["sentence\tlabel", "good\t1"])
    with pytest.raises(PlmError) as e:
        get_task("sst2").load(str(tmp_path))
    assert "SST-2/dev.tsv not found" in str(e.value) and "train.tsv, dev.tsv" in str(e.value)
    write(tmp_path / "SST-2" / "dev.tsv", ["text\tpolarity", "good\t1"])
    with pytest.raises(PlmError) as e:
        get_task("sst2").load(str(tmp_path))
    assert "SST-2/dev.tsv: expected a header with the columns sentence, label; found: text, polarity" in str(e.value)
    write(tmp_path / "SST-2" / "dev.tsv", ["sentence\tlabel", "good"])
    with pytest.raises(PlmError, match="dev.tsv line 2: 1 tab-separated fields, expected at least 2"):
        get_task("sst2").load(str(tmp_path))
    write(tmp_path / "CoLA" / "train.tsv", ["only\tthree\tcols"])
    with pytest.raises(PlmError, match="or 4 columns without a header"):
        get_task("cola").load(str(tmp_path))


def test_data_dir_errors(tmp_path):
    with pytest.raises(PlmError, match="is not a directory"):
        get_task("sst2").load(str(tmp_path / "nope"))
    with pytest.raises(PlmError, match="has no SST-2/ folder"):
        get_task("sst2").load(str(tmp_path))
    (tmp_path / "RTE").mkdir()
    with pytest.raises(PlmError, match="folder of another GLUE task"):
        get_task("sst2").load(str(tmp_path / "RTE"))


def test_no_data_dir_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PlmError) as e:
        get_task("cola").load(None)
    assert str(e.value).startswith("no --data-dir given and the Hub is unreachable") and "--data-dir path/to/glue" in str(e.value)


def test_registry_and_task_declarations():
    glue = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
    assert set(glue) <= set(TASKS)
    mains = {n: get_task(n).main_metric for n in glue}
    assert mains == {"cola": "mcc", "sst2": "accuracy", "mrpc": "f1", "stsb": "spearman", "qqp": "f1",
                     "mnli": "accuracy", "qnli": "accuracy", "rte": "accuracy", "wnli": "accuracy"}
    assert get_task("STS-B").num_labels == 1 and get_task("mnli").num_labels == 3
    assert get_task("mnli").test_splits["test_mismatched"] == "MNLI-mm.tsv"
    with pytest.raises(PlmError, match="did you mean sst2"):
        get_task("sst")
    # every registered task builds and names an objective that exists
    from plmcli.objectives.registry import objective_class

    for name in TASKS:
        task = get_task(name)
        assert task.name == name and objective_class(task.objective) and task.main_metric


def test_write_predictions(tmp_path):
    get_task("rte").write_predictions(tmp_path / "RTE.tsv", ["0", "1"], np.array([1, 0]))
    assert (tmp_path / "RTE.tsv").read_text() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n"
    get_task("stsb").write_predictions(tmp_path / "STS-B.tsv", ["0", "1"], np.array([5.7, 2.34567]))
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t5.000\n1\t2.346\n"


def _truncate_by_popping(a, b, budget):
    """BERT's _truncate_seq_pair, one token at a time."""
    while a + b > budget:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


def test_truncate_pair_matches_berts_loop():
    cases = list(itertools.product(range(0, 12), range(0, 12), range(1, 14)))
    la, lb, budget = (np.array(c) for c in zip(*cases))
    for bud in sorted(set(budget)):
        sel = budget == bud
        a, b = truncate_pair(la[sel], lb[sel], bud)
        for x, y, ga, gb in zip(la[sel], lb[sel], a, b):
            assert (ga, gb) == _truncate_by_popping(x, y, bud), (x, y, bud)


def test_encode_pairs_layout():
    specials = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}
    cfg = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens=specials)
    tok = train_tokenizer(["a b c d e f g h"], cfg)
    ids = special_token_ids(tok, resolve_special_tokens(cfg))
    enc = encode_pairs(tok, ids, ["a b c d e f", "a"], ["g h", "b c"], max_seq_len=8)
    rows = [enc["ids"][enc["offsets"][i]:enc["offsets"][i + 1]].tolist() for i in range(2)]
    w = tok.token_to_id
    # row 0: 6 + 2 tokens into 8 - 3 = 5 -> a keeps 3 (longest first), b keeps its 2.
    assert rows[0] == [ids["cls"], w("a"), w("b"), w("c"), ids["sep"], w("g"), w("h"), ids["sep"]]
    assert rows[1] == [ids["cls"], w("a"), ids["sep"], w("b"), w("c"), ids["sep"]]
    assert enc["type_start"].tolist() == [5, 3] and enc["truncated"].tolist() == [True, False]
    single = encode_pairs(tok, ids, ["a b c d e f g h"], None, max_seq_len=5)
    assert single["ids"].tolist() == [ids["cls"], w("a"), w("b"), w("c"), ids["sep"]] and single["type_start"].tolist() == [5]
    with pytest.raises(PlmError, match="no cls"):
        encode_pairs(tok, {"sep": 1}, ["a"], None, 8)


def test_encode_pairs_cls_last_layout():
    """XLNet's layout: a [SEP] b [SEP] [CLS] (single: a [SEP] [CLS]), the same truncation budget."""
    specials = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}
    cfg = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens=specials)
    tok = train_tokenizer(["a b c d e f g h"], cfg)
    ids = special_token_ids(tok, resolve_special_tokens(cfg))
    w = tok.token_to_id
    enc = encode_pairs(tok, ids, ["a b c d e f", "a"], ["g h", "b c"], max_seq_len=8, layout="cls_last")
    rows = [enc["ids"][enc["offsets"][i]:enc["offsets"][i + 1]].tolist() for i in range(2)]
    assert rows[0] == [w("a"), w("b"), w("c"), ids["sep"], w("g"), w("h"), ids["sep"], ids["cls"]]
    assert rows[1] == [w("a"), ids["sep"], w("b"), w("c"), ids["sep"], ids["cls"]]
    assert enc["type_start"].tolist() == [4, 2] and enc["truncated"].tolist() == [True, False]
    single = encode_pairs(tok, ids, ["a b c d e f g h"], None, max_seq_len=5, layout="cls_last")
    assert single["ids"].tolist() == [w("a"), w("b"), w("c"), ids["sep"], ids["cls"]]
