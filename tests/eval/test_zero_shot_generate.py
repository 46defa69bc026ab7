"""`plm zero-shot` with `score: generate` (GPT-2's translation and reading comprehension, Radford et al. 2019 §3):
the prompt in the paper's format, greedy decoding that stops at the newline, and BLEU / SQuAD F1 and exact match
equal to sacrebleu's corpus_bleu and SQuAD's scorer on the predictions. A "model" whose generations are fixed
(plmcli.generate.generate replaced) gives exact metric values; the tiny GPT run gives real generations."""

import json

import pytest
import sacrebleu

from helpers import assert_clean_error, pretrained_on, run
from plmcli import api
from plmcli import generate as generation
from plmcli.data.tasks.squad import score_answers
from plmcli.eval.zero_shot import zero_shot_config
from plmcli.eval.zero_shot_generate import data_path, prompts_of, read_examples

PAIRS = [("the cat", "le chat"), ("a red house", "une maison rouge"), ("the dog sleeps", "le chien dort"),
         ("good morning", "bonjour"), ("the big tree", "le grand arbre")]
PASSAGE = "Tom has a red bike. He rides it to school every day. His sister Ann walks."
QUESTIONS = [("What colour is the bike?", ["red", "a red one"]), ("Who walks?", ["Ann", "His sister Ann"]),
             ("Where does Tom ride?", ["to school"])]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """The run dir of TINY_RECIPE (char tokenizer) with 64 positions, trained 3 steps on text with newlines."""
    lines = [f"{s} = {t}" for s, t in PAIRS] + [PASSAGE] + [q for q, _ in QUESTIONS]
    return pretrained_on(tmp_path_factory.mktemp("zsg"), "\n".join(lines * 4) + "\n")


def pairs_file(tmp_path, header: bool = True):
    path = tmp_path / "pairs.tsv"
    path.write_text(("source\ttarget\n" if header else "") + "".join(f"{s}\t{t}\n" for s, t in PAIRS))
    return path


def squad_file(tmp_path):
    qas = [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": PASSAGE.find(a)} for a in golds]}
           for i, (q, golds) in enumerate(QUESTIONS)]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": PASSAGE, "qas": qas}]}]}))
    return path


@pytest.fixture
def fixed(monkeypatch):
    """plmcli.generate.generate replaced: it records each call's prompts and options and returns `fixed.outputs`."""
    class Fixed:
        outputs: list = []
        calls: list = []

    def fake(run, prompts, **options):
        Fixed.calls.append((list(prompts), options))
        return [Fixed.outputs[i % len(Fixed.outputs)] for i in range(len(prompts))]

    monkeypatch.setattr(generation, "generate", fake)
    return Fixed


def test_translation_prompt_is_gpt2s_format(gpt, tmp_path, fixed):
    """2 shots: 'english = french' lines, then 'english ='; the shots are not scored; BLEU is corpus_bleu's."""
    fixed.outputs = [" le chien dort", "bonjour !", "le petit arbre"]
    preds_file = tmp_path / "preds.jsonl"
    res = api.zero_shot(str(gpt), task="translation", data=str(pairs_file(tmp_path)), shots=2,
                        predictions=str(preds_file))
    (prompts, options), = fixed.calls
    assert prompts[0] == "the cat = le chat\na red house = une maison rouge\nthe dog sleeps ="
    assert prompts == [f"the cat = le chat\na red house = une maison rouge\n{s} =" for s, _ in PAIRS[2:]]
    assert options["strategy"] == "greedy" and options["stop"] == "\n" and options["max_new_tokens"] == 64
    preds = ["le chien dort", "bonjour !", "le petit arbre"]  # stripped
    refs = [t for _, t in PAIRS[2:]]
    bleu = sacrebleu.corpus_bleu(preds, [refs])
    assert res["kind"] == "generate" and res["metric"] == "bleu" and res["examples"] == 3 and res["shots"] == 2
    assert res["bleu"] == pytest.approx(bleu.score) and res["bleu_brevity_penalty"] == pytest.approx(bleu.bp)
    rows = [json.loads(x) for x in preds_file.read_text().splitlines()]
    assert [r["prediction"] for r in rows] == preds and [r["references"] for r in rows] == [[r] for r in refs]
    assert [r["id"] for r in rows] == ["line 4", "line 5", "line 6"]  # the header is line 1, the shots lines 2-3


def test_squad_f1_and_exact_match_are_squads(gpt, tmp_path, fixed):
    fixed.outputs = [" red", " Ann walks.", " school"]
    res = api.zero_shot(str(gpt), task="squad", data=str(squad_file(tmp_path)))
    (prompts, options), = fixed.calls
    assert prompts[1] == f"{PASSAGE}\nQ: Who walks?\nA:" and options["stop"] == "\n"
    preds, golds = ["red", "Ann walks.", "school"], [g for _, g in QUESTIONS]
    expected = score_answers(preds, golds, "squad")
    assert res["f1"] == pytest.approx(expected["f1"]) and res["exact_match"] == pytest.approx(expected["exact_match"])
    # by hand: "red" exact (100); "Ann walks" vs "Ann": F1 2/3; "school" vs "to school": F1 2/3
    assert res["exact_match"] == pytest.approx(100 / 3) and res["f1"] == pytest.approx(100 * (1 + 2 / 3 + 2 / 3) / 3)
    assert [p["f1"] for p in res["predictions"]] == pytest.approx([100, 200 / 3, 200 / 3])


def test_coqa_history_precedes_the_question(tmp_path):
    doc = {"data": [{"id": "s1", "story": PASSAGE,
                     "questions": [{"input_text": "Who has a bike?", "turn_id": 1}, {"input_text": "What colour?", "turn_id": 2}],
                     "answers": [{"input_text": "Tom", "turn_id": 1}, {"input_text": "red", "turn_id": 2}],
                     "additional_answers": {"0": [{"input_text": "Tom"}, {"input_text": "it is red"}]}}]}
    path = tmp_path / "coqa.json"
    path.write_text(json.dumps(doc))
    cfg = zero_shot_config(None, {"task": "squad", "data": str(path)})
    scored, prompts = prompts_of(cfg, read_examples(data_path(cfg.data), cfg.turn))
    assert prompts == [f"{PASSAGE}\nQ: Who has a bike?\nA:", f"{PASSAGE}\nQ: Who has a bike?\nA: Tom\nQ: What colour?\nA:"]
    assert [e.id for e in scored] == ["s1_1", "s1_2"] and scored[1].references == ["red", "it is red"]


def test_shipped_samples(gpt, fixed):
    fixed.outputs = [""]
    res = api.zero_shot(str(gpt), task="translation")
    assert res["examples"] == 36 and res["shots"] == 4 and res["bleu"] == 0.0
    assert fixed.calls[0][0][0].count(" = ") == 4 and fixed.calls[0][0][0].endswith(" =")
    targets = [e.references[0] for e in read_examples(data_path("en-fr-sample.txt"), "")][4:]
    fixed.outputs = targets
    assert api.zero_shot(str(gpt), task="translation")["bleu"] == pytest.approx(100.0)
    golds = [e.references[0] for e in read_examples(data_path("squad-sample.json"), "")]
    fixed.outputs = golds
    res = api.zero_shot(str(gpt), task="squad")
    assert res["examples"] == len(golds) and res["f1"] == res["exact_match"] == pytest.approx(100.0)


def test_greedy_decoding_stops_at_the_newline(gpt):
    """With stop "\\n" a row ends at the token that writes a newline: the output is the full greedy output cut there;
    with several stop strings, cut at the first of them."""
    model, tok, cfg = api.load_run(str(gpt))
    prompts = [f"{s} =" for s, _ in PAIRS] + ["", "the"]
    full = generation.generate((model, tok, cfg), prompts, max_new_tokens=40, device="cpu")
    cut = generation.generate((model, tok, cfg), prompts, max_new_tokens=40, device="cpu", stop="\n")
    assert cut == [f.split("\n", 1)[0] for f in full]
    several = generation.generate((model, tok, cfg), prompts, max_new_tokens=40, device="cpu", stop=["\n", "e", ""])
    assert several == [f.split("\n", 1)[0].split("e", 1)[0] for f in full]  # cut at whichever comes first


def test_cli_generate_stop_strings(gpt):
    """plm generate --stop (repeatable, \\n read as a newline): each output is the full greedy one cut at the first."""
    prompts = [f"{s} =" for s, _ in PAIRS]
    full = api.generate(str(gpt), prompts, max_new_tokens=30)
    res = run("generate", gpt, *(a for p in prompts for a in ("--prompt", p)), "--max-new-tokens", "30",
              "--stop", "\\n", "--stop", "\\t", "--stop", "  ", "--json")
    assert res.exit_code == 0, res.output
    cut = [r["output"] for r in json.loads(res.stdout)]
    assert cut == [r["output"].split("\n", 1)[0].split("\t", 1)[0].split("  ", 1)[0] for r in full]
    assert any(r["output"] != c for r, c in zip(full, cut))  # the stops did cut something (this model: spaces)


def test_a_row_ends_at_the_token_that_writes_the_newline(gpt):
    """A model whose 3rd prediction is always a newline: with stop, each row's decoding ends there (no 4th step)
    and its text is its first 2 tokens; without, it runs to max_new_tokens and holds the newline."""
    model, tok, cfg = api.load_run(str(gpt))
    newline = tok.token_to_id("\n")
    forward = model.decode_cached
    calls = []

    def scripted(ids, positions, cache, keep):
        logits, cache = forward(ids, positions, cache, keep)
        calls.append(ids.shape)
        if len(calls) == 3:
            logits[:, newline] = 1e9
        return logits, cache

    model.decode_cached = scripted
    prompts = ["the cat =", "good morning ="]
    cut = generation.generate((model, tok, cfg), prompts, max_new_tokens=20, device="cpu", stop="\n")
    assert len(calls) == 3 and all(len(tok.encode(c, add_special_tokens=False).ids) == 2 for c in cut)
    calls.clear()
    full = generation.generate((model, tok, cfg), prompts, max_new_tokens=20, device="cpu")
    assert len(calls) == 20 and [f.split("\n", 1)[0] for f in full] == cut and all(f[len(c)] == "\n" for f, c in zip(full, cut))


def test_cli_generated_tasks(gpt, tmp_path):
    """Real generations: each prediction is the model's greedy line after the prompt; BLEU is corpus_bleu of them."""
    preds_file = tmp_path / "p.jsonl"
    res = run("zero-shot", gpt, "--task", "translation", "--data", pairs_file(tmp_path, header=False), "--shots", "2",
              "--json", "--predictions", preds_file)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = [json.loads(x) for x in preds_file.read_text().splitlines()]
    preds = [r["prediction"] for r in rows]
    assert out["bleu"] == pytest.approx(sacrebleu.corpus_bleu(preds, [[t for _, t in PAIRS[2:]]]).score)
    model, tok, cfg = api.load_run(str(gpt))
    prompts = [f"the cat = le chat\na red house = une maison rouge\n{s} =" for s, _ in PAIRS[2:]]
    again = generation.generate((model, tok, cfg), prompts, max_new_tokens=64, device="cpu", stop="\n")
    assert preds == [t.strip() for t in again] and all("\n" not in p for p in preds)
    assert out["window"] == 64 and "predictions" not in out
    res = run("zero-shot", gpt, "--task", "squad", "--data", squad_file(tmp_path), "--max-examples", "2")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("zero-shot squad: exact_match ") and "(2 examples, 0-shot, greedy until '\\n')" in res.stdout


@pytest.mark.parametrize("args, needles", [
    (["--task", "translation", "--shots", "5"], ["5 examples and 5 of them shots: none left to score"]),
    (["--task", "translation", "--shots", "-1"], ["--shots"]),
    (["--task", "translation", "--data-dir", "x"], ["translation generates from --data, not --data-dir"]),
    (["--task", "translation", "--prompt", "{english} ="], ["names {english}", "use {source}, {target}"]),
    (["--task", "sst2", "--score", "generate"], ["score generate needs a metric"]),
])
def test_bad_requests_are_one_line(gpt, tmp_path, args, needles):
    assert_clean_error(run("zero-shot", gpt, "--data", pairs_file(tmp_path), *args), *needles)


def test_bad_files_are_one_line(gpt, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\ttwo\nno tab here\n")
    assert_clean_error(run("zero-shot", gpt, "--task", "translation", "--data", bad, "--shots", "0"),
                       "bad.tsv line 2: 1 tab-separated columns, not 2")
    assert_clean_error(run("zero-shot", gpt, "--task", "translation", "--data", tmp_path / "none.tsv"),
                       "--data", "is not a file")
