"""Zero-shot generation (Radford et al. 2019, §3.7 and §3.5): the model writes the prediction, greedily, after a
prompt, and a metric scores the text it wrote (a zero-shot config with `score: generate`).

translation      a TSV of source <TAB> target pairs (a `source<TAB>target` header allowed). GPT-2's format: the
                 first `shots` pairs as "english sentence = french sentence" lines, then "english sentence =";
                 the first generated line is the translation, scored by BLEU (sacrebleu's corpus_bleu).
reading          SQuAD-format JSON (each question with its passage, no history) or CoQA-format JSON (each
                 question after the conversation so far, {history}: one `turn` per earlier question): the
                 passage, the history, "Q: question" and "A:"; the first generated line is the answer, scored
                 by SQuAD v1.1's exact match and F1 (plmcli.data.tasks.squad.score_answers).

The prompt of an example is the `shot` template filled by each solved example (the data's first `shots` rows,
which are not scored), then the `prompt` template filled by the example. Decoding is greedy with the KV cache
(plmcli.generate), ends at `stop` (a newline) or after max_new_tokens, and the prediction is the text before
`stop`, stripped. The prompt is read as plm generate reads it: its start is cropped past the model's positions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from plmcli.config import shipped_sample
from plmcli.errors import PlmError, needs
from plmcli.eval.prompts import fill

SAMPLES = ("en-fr-sample.txt", "squad-sample.json")
"""Shipped in plmcli/corpus/ (data/ in the repository): `data: NAME` reads them when no such file exists here."""

PAIRS_HINT = "pass --data FILE: one source<TAB>target pair a line (a TSV), or SQuAD- / CoQA-format JSON"


@dataclass
class Prompted:
    """One example: its id, the fields its templates read, and the reference texts its prediction is scored against."""

    id: str
    fields: dict
    references: list


# ---------------------------------------------------------------- data


def data_path(data: str | None) -> str:
    """The file `data` names: a path, or a shipped sample (SAMPLES) when no such file exists here."""
    if not data:
        raise PlmError("generating zero-shot reads its examples from a file", PAIRS_HINT)
    if not Path(data).exists() and data in SAMPLES:
        return str(shipped_sample(data))
    if not Path(data).is_file():
        raise PlmError(f"--data {data} is not a file", PAIRS_HINT)
    return data


def read_pairs(path: str) -> list[Prompted]:
    """source <TAB> target lines (blank lines skipped; a first line `source<TAB>target` is a header)."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 2:
            raise PlmError(f"{path} line {n}: {len(cols)} tab-separated columns, not 2", "write source<TAB>target, one pair a line")
        if not out and n == 1 and [c.strip().lower() for c in cols] == ["source", "target"]:
            continue
        source, target = cols[0].strip(), cols[1].strip()
        out.append(Prompted(f"line {n}", {"source": source, "target": target}, [target]))
    return out


def read_questions(path: str, turn: str) -> list[Prompted]:
    """The questions of a SQuAD-format file (no history), or of a CoQA-format one (`turn` per earlier question)."""
    from plmcli.data.tasks.squad import SQUAD

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        doc = None  # SQuAD's reader says what is wrong
    stories = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(stories, list) and stories and isinstance(stories[0], dict) and "story" in stories[0]:
        return coqa_questions(stories, path, turn)
    out = []
    for e in SQUAD.read_file(Path(path), "dev") if doc is None else SQUAD.examples_of(doc, Path(path), "dev"):
        answer = e.answers[0] if e.answers else ""
        out.append(Prompted(e.id, {"context": e.context.strip(), "question": e.question.strip(), "history": "",
                                   "answer": answer}, list(e.answers)))
    return out


def coqa_questions(stories: list, path: str, turn: str) -> list[Prompted]:
    """CoQA's data[].{id, story, questions[].input_text, answers[].input_text, additional_answers}: each question
    after the story and the earlier turns of its conversation; every answer given to it is a reference."""
    out = []
    for s, story in enumerate(stories):
        try:
            questions = [q["input_text"].strip() for q in story["questions"]]
            answers = [a["input_text"].strip() for a in story["answers"]]
            more = [[a["input_text"].strip() for a in extra] for extra in (story.get("additional_answers") or {}).values()]
            context, sid = story["story"].strip(), str(story.get("id", s))
        except (KeyError, TypeError, AttributeError):
            raise PlmError(f"{path}: data[{s}] is not a CoQA story",
                           "CoQA-format JSON: data[].{id, story, questions[].input_text, answers[].input_text}") from None
        history = ""
        for i, (q, a) in enumerate(zip(questions, answers)):
            refs = [a] + [m[i] for m in more if i < len(m)]
            out.append(Prompted(f"{sid}_{i + 1}", {"context": context, "question": q, "history": history, "answer": a}, refs))
            history += fill(turn, {"question": q, "answer": a}, "turn")
    return out


def read_examples(path: str, turn: str) -> list[Prompted]:
    """Questions from a .json file, translation pairs from any other."""
    return read_questions(path, turn) if path.lower().endswith(".json") else read_pairs(path)


# ---------------------------------------------------------------- metrics


def bleu(preds: list[str], refs: list[list[str]]) -> tuple[dict, list[dict]]:
    """sacrebleu's corpus_bleu (its defaults: 13a tokenisation, exponential smoothing off) over the references."""
    sacrebleu = needs("sacrebleu", "tasks", "BLEU of zero-shot translation")
    counts = {len(r) for r in refs}
    if len(counts) != 1:
        raise PlmError("BLEU needs the same number of references for every example", "give each source one target")
    streams = [[r[i] for r in refs] for i in range(counts.pop())]
    res = sacrebleu.corpus_bleu(preds, streams)
    return {"bleu": float(res.score), "bleu_brevity_penalty": float(res.bp)}, [{} for _ in preds]


def squad_scores(preds: list[str], refs: list[list[str]]) -> tuple[dict, list[dict]]:
    """SQuAD v1.1's exact match and F1 in percent, the best over each question's references."""
    from plmcli.data.tasks.squad import score_answers

    each = [score_answers([p], [r]) for p, r in zip(preds, refs)]
    return score_answers(preds, refs), each


METRICS = {"bleu": bleu, "squad_f1": squad_scores}
"""metric name -> (predictions, their references) -> (corpus metrics, per-example metrics)."""


# ---------------------------------------------------------------- prompts and the command


def prompts_of(cfg, examples: list[Prompted]) -> tuple[list[Prompted], list[str]]:
    """(the examples scored, their prompts): the first cfg.shots examples, solved (cfg.shot), before each prompt."""
    if not cfg.prompt:
        raise PlmError("score generate needs a prompt template", "e.g. prompt: \"{source} =\" in the zero-shot config")
    if cfg.shots and not cfg.shot:
        raise PlmError(f"shots: {cfg.shots} needs a shot template, how a solved example reads",
                       "e.g. shot: \"{source} = {target}\\n\" in the zero-shot config")
    shown, scored = examples[:cfg.shots], examples[cfg.shots:][:cfg.max_examples or None]
    if not scored:
        raise PlmError(f"{len(examples)} examples and {cfg.shots} of them shots: none left to score",
                       "pass fewer --shots or more data")
    head = "".join(fill(cfg.shot, e.fields, "shot") for e in shown)
    return scored, [head + fill(cfg.prompt, e.fields, "prompt") for e in scored]


def score_generated(run, cfg, batch_size: int, device) -> dict:
    """Generate each example's prediction greedily and score them by cfg.metric. `run`: (model, tokenizer, run
    config) of a causal LM; `cfg`: the ZeroShotConfig (score generate)."""
    from plmcli import generate as generation

    if cfg.metric is None:
        raise PlmError("score generate needs a metric", "set metric: bleu or squad_f1 in the zero-shot config")
    if cfg.data_dir is not None:
        raise PlmError(f"{cfg.task} generates from --data, not --data-dir", PAIRS_HINT)
    path = data_path(cfg.data)
    examples = read_examples(path, cfg.turn)
    scored, prompts = prompts_of(cfg, examples)
    texts = generation.generate(run, prompts, max_new_tokens=cfg.max_new_tokens, strategy="greedy",
                                batch_size=batch_size, device=device, stop=cfg.stop or None)
    preds = [t.strip() for t in texts]
    refs = [e.references for e in scored]
    summary, each = METRICS[cfg.metric](preds, refs)
    return {"task": cfg.task, "kind": "generate", "data": cfg.data, "examples": len(scored), "shots": cfg.shots,
            "metric": cfg.metric, **summary, "prompt": cfg.prompt, "shot": cfg.shot, "stop": cfg.stop,
            "max_new_tokens": cfg.max_new_tokens,
            "predictions": [{"id": e.id, "prediction": p, "references": e.references, **m}
                            for e, p, m in zip(scored, preds, each)]}
