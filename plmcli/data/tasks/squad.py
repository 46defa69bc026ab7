"""Span-extraction reading comprehension in the SQuAD v1.1 JSON format: SQuAD (Rajpurkar et al. 2016)
and CMRC 2018 (Cui et al. 2019, the Chinese counterpart).

Files: `--train FILE --dev FILE [--test FILE]` (any SQuAD-format JSON), or `--data-dir` holding the
official names (SQuAD: train-v1.1.json, dev-v1.1.json; CMRC 2018: cmrc2018_train.json,
cmrc2018_dev.json and, as the test split, cmrc2018_trial.json), or neither: the Hub (`rajpurkar/squad`,
`hfl/cmrc2018`). The CMRC copy in ../shared has only dev (3,219 questions) and trial (1,002): train on
dev and evaluate on trial (`--train cmrc2018_dev.json --dev cmrc2018_trial.json`).

Training uses one answer per question, the first whose text sits at its `answer_start` (BERT's
run_squad and HF's run_qa train on the first answer). A training question with no such answer
(a character offset counted in UTF-16 units, a typo in the text) is skipped and counted in
`skipped` (metrics.json: skipped_rows). Dev and test questions are all kept, and scoring uses every
gold answer as written.

Scoring is each benchmark's official script, in percent as they print it: SQuAD v1.1 exact match
and F1 over bags of normalised words (lower case, no ASCII punctuation, no articles a/an/the); CMRC
2018 exact match without punctuation and F1 over segments (each Chinese character one segment, runs
of other text split into words by nltk.word_tokenize, as the script does) whose overlap is their
longest common *substring*, as cmrc2018_evaluate.py computes it. Both take the best score over the gold answers.
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from plmcli.data.tasks import Task
from plmcli.errors import PlmError, needs


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list = field(default_factory=list)
    """Every gold answer text, as written (what evaluation scores against)."""
    span: tuple | None = None
    """(start, end) characters of the answer the model trains towards: the first gold answer found at
    its answer_start; None when there is none (unlabeled test questions, misaligned dev answers)."""


# ------------------------------------------------------------------ metrics


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalize_answer: lower case, drop ASCII punctuation, articles and extra whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


_PUNCT = set(string.punctuation)


def squad_exact(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def squad_f1(pred: str, gold: str) -> float:
    """F1 of the normalised word bags (SQuAD v1.1's f1_score)."""
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


# cmrc2018_evaluate.py's list as it stands; its '……' is two characters and so never matches one.
_CMRC_PUNCT = {'-', ':', '_', '*', '^', '/', '\\', '~', '`', '+', '=', '，', '。', '：', '？', '！', '“', '”', '；',
               '’', '《', '》', '……', '·', '、', '「', '」', '（', '）', '－', '～', '『', '』'}
_CJK = re.compile(r"[\u4e00-\u9fa5]")

# cmrc2018_evaluate.py splits the non-Chinese runs with nltk.word_tokenize: NLTK's Treebank-style word
# tokenizer applied to each sentence that Punkt's English model finds (a sentence split matters: only a
# sentence's last period is split off, "sales. then" -> sales . then, while "u.s. sales" stays). The model is
# a data package (punkt_tab) that pip cannot install; what follows is the part of it that Punkt can consult
# on the lowercased text the script feeds it, so the splits are those of the whole model on any such text:
# all its abbreviations, collocations and sentence starters, and of its orthographic table only the 4
# words whose flags let a lowercase word after an initial or a number start a sentence ("unknown" in
# Punkt's ortho heuristic; every other word, and any word absent, reads the same as absent). The other
# 20,361 entries only ever answer for capitalised words. From NLTK's punkt_tab English model (Kiss &
# Strunk 2006, trained on the Wall Street Journal); tests/data/test_cmrc_official.py checks it against
# the full model when that is installed.
_PUNKT_ABBREVS = (
    "ct m.j t a.c n.h ms p.a.m dr pa p.m u.k st dec u.s.a lt g.k adm p h.m ga tenn yr sen n.c j.j d.h s.g inc vs "
    "s.p.a a.t n feb sr jan s.a.y n.y col g.f c.o.m.b d ft va r.k e.f chg r.i a.g minn a.h k n.j m l.f f.j gen "
    "i.m.s s.a aug j.p okla m.d.c ltd oct s vt r.a j.c ariz w.w b.v ore h w.r e.h mrs cie corp w n.v a.d r.j ok "
    "e.m w.c ill nov u.s prof conn u.s.s.r mg f.g ph.d g calif messrs h.f wash tues sw bros u.n l wis mr sep d.c "
    "ave e.l co s.s reps c r.t h.c r wed a.s v fla jr r.h c.v m.b.a rep a.a e c.i.t l.a b.f j.b d.w j.k ala f "
    "w.va sept mich n.m j.r l.p s.c colo fri a.m g.d kan maj ky a.m.e n.d t.j cos nev")  # and ". . ", never a token
_PUNKT_COLLOCATIONS = (
    "b stewart, i toussie, j fialka, o ludcke, i magnin, b wigton, b edelman, b levine, b smith, j walter, "
    "j aron, " + ", ".join(f"##number## {w}" for w in (
        "international rj commodities cooper genentech wedgestone pepper insider aes credit corrections financing "
        "henley business pay-fone leisure pegasus dividend review abreast who letters colgate cbot notable "
        "zimmer").split()))
_PUNKT_SENT_STARTERS = (
    "most he since so both these it nevertheless this indeed however instead under similarly some though while "
    "when in despite although nonetheless thus there if the nor separately moreover but they yet many according "
    "sales among meanwhile even i")
_PUNKT_ORTHO = {"z-holiday": 16, "administrators": 48, "r-revised": 16, "b-week": 16}


CMRC_FEATURE = "CMRC 2018 scoring (its official scorer's nltk word split)"
"""What nltk is for, in the error naming the tasks extra when it is missing (errors.needs)."""


@functools.lru_cache(maxsize=1)
def _punkt_english():
    punkt = needs("nltk.tokenize.punkt", "tasks", CMRC_FEATURE)
    PunktParameters, PunktSentenceTokenizer = punkt.PunktParameters, punkt.PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(_PUNKT_ABBREVS.split())
    params.collocations = {tuple(pair.split()) for pair in _PUNKT_COLLOCATIONS.split(", ")}
    params.sent_starters = set(_PUNKT_SENT_STARTERS.split())
    params.ortho_context = defaultdict(int, _PUNKT_ORTHO)
    return PunktSentenceTokenizer(params)  # Punkt takes ready parameters in place of training text


@functools.lru_cache(maxsize=1)
def _treebank():
    return needs("nltk.tokenize", "tasks", CMRC_FEATURE).NLTKWordTokenizer()


def cmrc_words(text: str) -> list[str]:
    """nltk.word_tokenize(text) for lowercase text (what cmrc2018_evaluate.py gives it), without its data
    package: Punkt's English sentences, each split by NLTK's word tokenizer."""
    return [w for sentence in _punkt_english().tokenize(text) for w in _treebank().tokenize(sentence)]


def cmrc_segments(text: str, remove_punc: bool = True) -> list[str]:
    """cmrc2018_evaluate.py's mixed_segmentation: each Chinese character (and, kept, each listed
    punctuation mark) is a segment; the text between them is split into words by `cmrc_words`."""
    out, run = [], ""
    for ch in str(text).lower().strip():
        if remove_punc and ch in _CMRC_PUNCT:
            continue
        if _CJK.match(ch) or ch in _CMRC_PUNCT:
            out.extend(cmrc_words(run) if run else [])
            run = ""
            out.append(ch)
        else:
            run += ch
    out.extend(cmrc_words(run) if run else [])
    return out


def _longest_common_substring(a: list, b: list) -> int:
    """Length of the longest run of segments shared by a and b (cmrc2018_evaluate.py's find_lcs)."""
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                cur[j + 1] = prev[j] + 1
                best = max(best, cur[j + 1])
        prev = cur
    return best


def cmrc_exact(pred: str, gold: str) -> float:
    strip = lambda s: "".join(ch for ch in str(s).lower().strip() if ch not in _CMRC_PUNCT)  # noqa: E731
    return float(strip(pred) == strip(gold))


def cmrc_f1(pred: str, gold: str) -> float:
    p, g = cmrc_segments(pred), cmrc_segments(gold)
    same = _longest_common_substring(g, p)
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


SCORERS = {"squad": (squad_exact, squad_f1), "cmrc": (cmrc_exact, cmrc_f1)}
"""Scorer name -> (exact match, F1) of one prediction against one gold answer."""


def score_answers(preds: list[str], golds: list[list[str]], scorer: str = "squad") -> dict[str, float]:
    """{"exact_match", "f1"} in percent: the mean over questions of the best score over each question's
    gold answers. A question without gold answers scores 1 for an empty prediction, else 0 (SQuAD 2.0's rule)."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predictions for {len(golds)} questions")
    if not preds:
        return {"exact_match": 0.0, "f1": 0.0}
    exact, f1 = SCORERS[scorer]

    def best(fn, pred, gold):
        return max(fn(pred, g) for g in gold) if gold else float(not pred.strip())

    em = sum(best(exact, p, gs) for p, gs in zip(preds, golds))
    f = sum(best(f1, p, gs) for p, gs in zip(preds, golds))
    return {"exact_match": 100.0 * em / len(preds), "f1": 100.0 * f / len(preds)}


# ------------------------------------------------------------------ the task


@dataclass
class SquadTask(Task):
    name: str = "squad"
    objective: str = "qa"
    num_labels: int = 2
    """Two scores per token: answer start and answer end."""
    metrics: tuple = ("exact_match", "f1")
    main_metric: str = "f1"
    scorer: str = "squad"
    """Key of SCORERS: the benchmark's own evaluation script."""
    files: dict = field(default_factory=lambda: {"train": "train-v1.1.json", "dev": "dev-v1.1.json"})
    """Split -> file name in --data-dir (a "test" entry is optional)."""
    hub: str = "rajpurkar/squad"
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "dev": "validation"})
    hint: str = "pass --train train-v1.1.json --dev dev-v1.1.json (any SQuAD-format JSON), or --data-dir holding them"
    eval_splits: dict = field(default_factory=lambda: {"dev": ""})
    # The dev predictions are written too (after training, from the best weights), as the official
    # evaluation scripts read them: {question id: answer}.
    test_splits: dict = field(default_factory=lambda: {"validation": "predictions.json", "test": "test_predictions.json"})
    skipped: dict = field(default_factory=dict)
    """Training file -> questions skipped because no answer text sits at its answer_start."""

    def load(self, data_dir: str | None) -> dict[str, list[QAExample]]:
        """Splits train, dev and (when given) test: --train/--dev/--test, else --data-dir, else the Hub."""
        self.skipped = {}
        o = self.options
        given = {s: Path(p) for s, p in (("train", o.train), ("dev", o.dev), ("test", o.test)) if p}
        paths = {**(self._folder_files(data_dir) if data_dir is not None else {}), **given}
        if data_dir is None and not given:
            return self._load_hub()
        missing = [s for s in ("train", "dev") if s not in paths]
        if missing:
            where = f" (not in --data-dir {data_dir})" if data_dir is not None else ""
            raise PlmError(f"{self.name} needs a {' and a '.join(missing)} file{where}", self.hint)
        return {split: self.read_file(path, split) for split, path in paths.items()}

    def _folder_files(self, data_dir) -> dict[str, Path]:
        root = Path(data_dir)
        if not root.is_dir():
            raise PlmError(f"--data-dir {root} is not a directory", self.hint)
        return {s: root / f for s, f in self.files.items() if (root / f).is_file()}

    def read_file(self, path: Path, split: str) -> list[QAExample]:
        """The questions of one SQuAD-format file; a training split keeps only answerable ones."""
        if not path.is_file():
            raise PlmError(f"{path} not found", self.hint)
        try:
            doc = json.loads(path.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError as e:
            raise PlmError(f"{path} is not UTF-8 text (byte {e.start})", "pass SQuAD-format JSON") from None
        except json.JSONDecodeError as e:
            raise PlmError(f"{path} is not JSON ({e.msg} at line {e.lineno})", "pass SQuAD-format JSON") from None
        return self.examples_of(doc, path, split)

    def examples_of(self, doc, path: Path, split: str) -> list[QAExample]:
        """read_file's questions from the file's parsed JSON `doc` (a caller that has parsed it already)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            raise PlmError(f"{path} has no top-level 'data' list", "pass SQuAD-format JSON: {\"data\": [{\"paragraphs\": [...]}]}")
        rows = []
        for a, article in enumerate(doc["data"]):
            for p, para in enumerate(_field(article, "paragraphs", list, path, f"data[{a}]")):
                where = f"data[{a}].paragraphs[{p}]"
                context = _field(para, "context", str, path, where)
                for q, qa in enumerate(_field(para, "qas", list, path, where)):
                    rows.append((context, qa, f"{where}.qas[{q}]"))
        examples = self._examples(rows, path, labeled=split != "test")
        if split == "train":
            kept = [e for e in examples if e.span is not None]
            if len(kept) < len(examples):
                self.skipped[str(path)] = len(examples) - len(kept)
            examples = kept
        if not examples:
            raise PlmError(f"{path} has no {'answerable ' if split == 'train' else ''}questions",
                           "pass SQuAD-format JSON whose answers' text sits at their answer_start")
        return examples

    def _examples(self, rows, path, labeled: bool) -> list[QAExample]:
        """rows: (context, qa dict, location) -> QAExamples; ids checked unique (predictions are keyed by them)."""
        out, seen = [], set()
        for context, qa, where in rows:
            if not isinstance(qa, dict):
                raise PlmError(f"{path}: {where} is not an object", "pass SQuAD-format JSON")
            if qa.get("is_impossible"):
                raise PlmError(f"{path}: {where} is marked is_impossible (SQuAD 2.0)",
                               "span QA here is SQuAD 1.1: every question has an answer in its passage")
            qid = str(qa.get("id", len(out)))
            if qid in seen:
                raise PlmError(f"{path}: question id {qid!r} appears twice", "give every question its own id")
            seen.add(qid)
            question = _field(qa, "question", str, path, where)
            answers = (qa.get("answers") or []) if labeled else []
            if not isinstance(answers, list):
                raise PlmError(f"{path}: {where} has 'answers' that is not a list", "pass SQuAD-format JSON")
            texts, span = [], None
            for k, ans in enumerate(answers):
                text = _field(ans, "text", str, path, f"{where}.answers[{k}]")
                texts.append(text)
                try:
                    start = int(ans.get("answer_start", -1))
                except (TypeError, ValueError):
                    start = -1
                if span is None and text.strip() and start >= 0 and context[start:start + len(text)] == text:
                    span = (start, start + len(text))
            out.append(QAExample(qid, question, context, texts, span))
        return out

    def _load_hub(self) -> dict[str, list[QAExample]]:
        offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                      for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        if offline:
            raise PlmError("no --train/--dev or --data-dir given and the Hub is unreachable (offline mode is set)", self.hint)
        try:
            import datasets

            ds = datasets.load_dataset(self.hub)
        except Exception as e:  # no network, DNS, proxy, ...: all mean "give me files"
            raise PlmError(f"no --train/--dev or --data-dir given and the Hub is unreachable ({type(e).__name__})",
                           self.hint) from e
        splits = {}
        for split, hub in self.hub_splits.items():
            rows = [(r["context"], {"id": r["id"], "question": r["question"],
                                    "answers": [{"text": t, "answer_start": s} for t, s in
                                                zip(r["answers"]["text"], r["answers"]["answer_start"])]},
                     f"{hub}[{i}]") for i, r in enumerate(ds[hub])]
            examples = self._examples(rows, f"{self.hub} {hub}", labeled=True)
            if split == "train":
                kept = [e for e in examples if e.span is not None]
                if len(kept) < len(examples):
                    self.skipped[f"{self.hub} {hub}"] = len(examples) - len(kept)
                examples = kept
            splits[split] = examples
        return splits

    def score(self, preds, golds) -> dict[str, float]:
        return score_answers(list(preds), list(golds), self.scorer)

    def write_predictions(self, path: Path, ids, preds) -> None:
        """{question id: answer text}, the file the official evaluation scripts read."""
        answers = {str(i): str(p) for i, p in zip(ids, preds)}
        Path(path).write_text(json.dumps(answers, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def _field(obj, key: str, kind: type, path, where: str):
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind):
        raise PlmError(f"{path}: {where} has no {key!r} ({kind.__name__})",
                       "pass SQuAD-format JSON: data[].paragraphs[].{context, qas[].{id, question, answers[].{text, answer_start}}}")
    return value


SQUAD = SquadTask()
CMRC2018 = SquadTask(
    name="cmrc2018", scorer="cmrc",
    files={"train": "cmrc2018_train.json", "dev": "cmrc2018_dev.json", "test": "cmrc2018_trial.json"},
    hub="hfl/cmrc2018",
    hint="pass --train FILE --dev FILE (SQuAD-format JSON; with only the dev and trial files: "
         "--train cmrc2018_dev.json --dev cmrc2018_trial.json)",
)
