"""The summary at the top of BENCHMARKS.md, generated from the figures its sections record.

    python benchmarks/summary.py           rewrite the block between <!-- summary:begin --> and <!-- summary:end -->
    python benchmarks/summary.py --check   exit 1 if that block is not what the sections give (tests/test_docs.py)

One row per benchmark section (`<!-- bench:NAME -->` ... `<!-- /bench:NAME -->`), grouped under the topic
(`# ` heading) the section sits in: its quality figure and its speed (or cost) figure, read from the section by
ROWS below, and the machine and date from its `- Machine:` and `- Date:` lines. A benchmark that re-runs rewrites
only its own section, so run this afterwards. When a section's layout changes and a row's reader no longer finds
its figure, this script names the section and what it looked for: update that reader in ROWS. A new section
needs a row in ROWS (or a place in UNSUMMARISED).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable

BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
BEGIN, END = "<!-- summary:begin -->", "<!-- summary:end -->"
SECTION = re.compile(r"<!-- bench:([\w.-]+) -->\n(.*?)\n<!-- /bench:\1 -->", re.S)
# Sections that are a summary of their own, not one benchmark.
UNSUMMARISED = {"goals"}


class Missing(LookupError):
    """A reader did not find its figure in a section."""


# ---------------------------------------------------------------- reading a section


def _cells(line: str) -> list[str]:
    return [c.strip().replace("**", "").strip() for c in line.strip().strip("|").split("|")]


def _rows(text: str) -> list[list[str]]:
    return [_cells(line) for line in text.splitlines()
            if line.startswith("|") and not re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", line)]


def cell(text: str, key: str | tuple[str, ...], col: int) -> str:
    """Column `col` of the first table row whose leading cells are `key` (a cell ending in '*' matches by prefix)."""
    keys = (key,) if isinstance(key, str) else key
    for row in _rows(text):
        if len(row) > col and all(c.startswith(k[:-1]) if k.endswith("*") else c == k for c, k in zip(row, keys)):
            return row[col]
    raise Missing(f"a table row starting {' | '.join(keys)!r} with a column {col}")


def column(text: str, header: str) -> list[str]:
    """Every value of the column titled `header`, in the first table that has one."""
    rows = _rows(text)
    for i, row in enumerate(rows):
        if header in row:
            j = row.index(header)
            out = []
            for r in rows[i + 1:]:
                if len(r) != len(row):
                    break
                out.append(r[j])
            return out
    raise Missing(f"a table column {header!r}")


def find(text: str, pattern: str) -> tuple[str, ...]:
    """The groups of `pattern` in `text`'s prose, its line breaks read as spaces."""
    m = re.search(pattern, re.sub(r"\s+", " ", text))  # prose wraps anywhere
    if not m:
        raise Missing(f"the pattern {pattern!r}")
    return m.groups()


def first_word(value: str) -> str:
    return value.split()[0]


def span(values: list[str]) -> str:
    """'a–b' over values like '5.2×' or '1,234.5×', by their numbers."""
    nums = sorted(values, key=lambda v: float(re.sub(r"[^\d.]", "", v)))
    return f"{nums[0]}–{nums[-1]}"


def pending(text: str) -> bool:
    return "**Not measured yet:**" in text


def machine(text: str) -> str:
    if pending(text):
        return "—"
    m = re.search(r"^- Machine: (.+)$", text, re.M)
    if not m:
        raise Missing("a '- Machine:' line")
    line = m[1].split(";")[0]
    line = re.sub(r"\((R|TM)\)", "", line)
    line = re.sub(r"\s*\(flags:[^)]*\)", "", line)

    def threads(t: re.Match) -> str:
        return f", {t[1]} thread{'' if t[1] == '1' else 's'}"

    line = re.sub(r"\s*\((\d+) torch threads?\)", threads, line)
    line = re.sub(r",\s*(\d+) torch threads?", threads, line)
    line = re.sub(r"\s*\([^)]*\)", "", line)
    line = re.sub(r"\s+Processor\b", "", line)
    line = re.sub(r"\s+shared with .*", "", line)
    return re.sub(r"\s+", " ", line).strip(" ,")


def date(text: str) -> str:
    if pending(text):
        return "—"
    m = re.search(r"^- Date: (\d{4}-\d{2}-\d{2}(?:/\d{2})?)", text, re.M)
    if not m:
        raise Missing("a '- Date:' line")
    shared = "**Preliminary:**" in text or re.search(r"^- Date: .*\*Preliminary\*", text, re.M)
    return m[1] + (", preliminary" if shared else "")


# ---------------------------------------------------------------- the rows

Reader = Callable[[str], str] | None


def _goal(s: str, what: str = "plm") -> str:
    return find(s, r"Goal: " + re.escape(what) + r" ≥ ([\d.]+×)")[0]


def _step(bf16: bool) -> Callable[[str], str]:
    def read(s: str) -> str:
        ratio = cell(s, "plm / transformers", 1)
        goal = _goal(s)
        if bf16:
            return f"{ratio} transformers (the fp32 goal: ≥ {goal}); {cell(s, 'plm', 8)} of the bf16 GEMM probe"
        return f"{ratio} transformers (goal ≥ {goal}); {cell(s, 'plm', 6)} of the fp32 GEMM probe"
    return read


def _sst2(s: str) -> str:
    pre = cell(s, "SST-2 from pretrained", 3).replace("dev acc ", "")
    rand = cell(s, "SST-2 from random", 3).replace("dev acc ", "")
    return (f"SST-2 dev {pre} pretrained vs {rand} random init ({cell(s, 'gain', 3)}; goal +3); "
            f"{cell(s, 'pretrain', 3)}")


def _low_resource(s: str) -> str:
    def gain(task: str) -> str:
        return cell(s, (task, "1,000"), 5)
    return (f"1,000 rows, pretrained − random init: SST-2 {gain('SST-2 (dev accuracy)')}, ChnSentiCorp "
            f"{gain('ChnSentiCorp (dev accuracy)')}, NER {gain('CoNLL-2003 NER (dev entity F1)')} points (goal +5)")


def _low_resource_cost(s: str) -> str:
    return (f"pretraining: {cell(s, 'English*', 5)} (English), {cell(s, 'Chinese*', 5)} (Chinese) of CPU")


def _tokenize_memory(s: str) -> str:
    small, large, corpus, _, rss = find(
        s, r"From ([\d,]+ MB) to ([\d,]+ MB) of text \(([\d.]+×) the corpus\) peak RSS changed by "
           r"([+−-]?[\d,]+ MiB) \(([\d.]+×)\)")
    return f"peak RSS {rss} from {small} to {large} of text"


def _gpu_mfu(s: str) -> str:
    if pending(s):
        return "pending"
    mfu = ", ".join(f"{model.strip('`')} {value}" for model, value in zip(column(s, "model"), column(s, "MFU")))
    return f"MFU {mfu} (goal ≥ 45%)"


def _gpu_varlen(s: str) -> str:
    if pending(s):
        return "pending"
    return f"unpadded {cell(s, 'unpadded (jagged)', 3)} the padded step's real tokens/s"


def _gpu_check(s: str) -> str:
    return "pending" if pending(s) else "measured: see the section"


ROWS: dict[str, tuple[Reader, Reader]] = {
    # training speed
    "nanogpt-char": (
        lambda s: f"val loss {cell(s, 'plm', 1)} vs nanoGPT's {cell(s, 'nanoGPT', 1)}",
        lambda s: f"wall {cell(s, 'plm ÷ nanoGPT', 2)} nanoGPT's (goal {cell(s, 'goal', 2)})"),
    "gpt-train-step": (None, _step(False)),
    "gpt-train-step-bf16": (None, _step(True)),
    "bert-train-step": (None, _step(False)),
    "bert-train-step-bf16": (None, _step(True)),
    "pretrain-step-xlnet": (
        lambda s: "losses equal at the shared start: " + find(s, r"the losses agree \(plm ([\d.]+), transformers")[0],
        _step(False)),
    "pretrain-step-electra": (
        lambda s: "losses equal at the shared start: " + find(s, r"the losses agree \(plm ([\d.]+), transformers")[0],
        _step(False)),
    "lstm-step": (
        None,
        lambda s: f"{cell(s, 'plm', 3)} a plain nn.LSTM loop (goal ≥ {_goal(s)})"),
    "lm-head": (
        None,
        lambda s: f"the fused head {span(column(s, 'plain ÷ default'))} faster than logits + cross-entropy"),
    "redesign": (
        lambda s: "losses and perplexities equal to the last digit",
        lambda s: (f"GPT-2 step {first_word(cell(s, 'gpt-train-step, plm / transformers (median of 5)', 1))} → "
                   f"{first_word(cell(s, 'gpt-train-step, plm / transformers (median of 5)', 2))}, BERT-mini step "
                   f"{first_word(cell(s, 'bert-train-step, plm / transformers (median of 5)', 1))} → "
                   f"{first_word(cell(s, 'bert-train-step, plm / transformers (median of 5)', 2))} transformers, "
                   "before → after: within the spread")),
    # perplexity and language-model quality
    "ngram-ptb": (
        lambda s: (f"KN5 test ppl {cell(s, '`ngram-kn5` (all of train)', 1)} (published "
                   f"{cell(s, '`ngram-kn5` (all of train)', 2)}); add-λ bigram "
                   f"{cell(s, '`ngram-bigram-addk` (all of train)', 1)}"),
        lambda s: (f"KN5 pretrain {first_word(cell(s, '`ngram-kn5` (all of train)', 4))} s, eval-ppl "
                   f"{first_word(cell(s, '`ngram-kn5` (all of train)', 5))} s")),
    "lstm-ptb": (
        lambda s: (f"test ppl {cell(s, 'plm `lstm-ptb-small` (30 CPU-minutes)', 1)} (Zaremba et al.: "
                   f"{cell(s, 'Zaremba et al. 2014, small (quoted)', 1)})"),
        lambda s: f"{cell(s, 'plm `lstm-ptb-small` (30 CPU-minutes)', 3)} of training"),
    "txl-vs-gpt": (
        lambda s: "test ppl {} Transformer-XL vs {} GPT".format(
            *find(s, r"Transformer-XL with memory ([\d.]+) vs GPT's best ([\d.]+)")),
        None),
    "ppl-speed": (
        lambda s: (f"ppl {cell(s, 'plm eval-ppl, batch 8', 4)} vs the guide's "
                   f"{cell(s, 'transformers guide loop, batch 1', 4)} (conventions differ)"),
        lambda s: (f"eval-ppl {cell(s, 'plm eval-ppl, batch 8 / guide loop', 1)} the guide loop "
                   f"(goal ≥ {_goal(s)})")),
    "word2vec": (
        lambda s: (f"analogies: skip-gram {cell(s, 'plm skip-gram (`word2vec-sg`)', 2)} vs gensim "
                   f"{cell(s, 'gensim skip-gram*', 2)}, CBOW {cell(s, 'plm cbow (`word2vec-cbow`)', 2)} vs "
                   f"{cell(s, 'gensim cbow*', 2)}"),
        lambda s: (f"{cell(s, 'plm ÷ gensim, skip-gram', 6)} (skip-gram), {cell(s, 'plm ÷ gensim, cbow', 6)} (CBOW) "
                   "gensim's words/s")),
    # what pretraining buys
    "bert-sst2": (_sst2, lambda s: f"pretraining {cell(s, 'pretrain', 2)}"),
    "bert-plateau": (
        lambda s: ("val loss after 2000 steps: plm BERT {}, transformers BERT {}, NEZHA {}".format(
            *[cell(s, 'val loss after 2000 steps', i) for i in (1, 2, 3)])),
        None),
    "bert-sst2-nezha-mini": (_sst2, lambda s: f"pretraining {cell(s, 'pretrain', 2)}"),
    "family-sst2": (
        lambda s: "SST-2 dev: BERT {}, ELECTRA {}, ALBERT {} (one seed each)".format(
            *[cell(s, f"`{r}-mini`", 9) for r in ("bert", "electra", "albert")]),
        lambda s: "pretraining walls {}, {}, {}".format(*[cell(s, f"`{r}-mini`", 6) for r in ("bert", "electra", "albert")])),
    "small-data-finetune": (
        lambda s: (f"worst seed with the defaults: {cell(s, ('pretrained', 'defaults'), 7)} pretrained, "
                   f"{cell(s, ('random', 'defaults'), 7)} random init (goal ≥ 0.65)"),
        None),
    "low-resource-nezha-mini-cpu": (_low_resource, _low_resource_cost),
    "low-resource-word2vec-transfer": (_low_resource, _low_resource_cost),
    # finetuning tasks and speed
    "conll-ner": (
        lambda s: f"entity F1: softmax {cell(s, 'softmax', 3)}, CRF {cell(s, 'CRF', 3)}",
        lambda s: f"{cell(s, 'CRF', 7)} an epoch"),
    "cmrc2018": (lambda s: f"{cell(s, 'finetune on dev*', 2)} (trial set)", None),
    "varlen-sst2": (
        None,
        lambda s: (f"length-grouped batches {cell(s, 'plm finetune: length-grouped (window 50)', 3)} the real "
                   f"tokens/s of shuffled ones, {cell(s, 'plm finetune: length-grouped (window 50)', 4)} padding")),
    "frozen-epoch": (
        None,
        lambda s: "{} less time per epoch with --freeze".format(
            *find(s, r"Ratio of medians: \*\*([\d.]+×)\*\* less time per epoch frozen"))),
    # data and input pipeline
    "mlm-data": (
        None,
        lambda s: (f"make-mlm-data, 1 process: {cell(s, 'plm make-mlm-data --masking token --num-proc 1*', 3)} the "
                   f"collators (pt / np; goal ≥ {_goal(s, 'make-mlm-data')})")),
    "tokenize-speed": (
        None,
        lambda s: (f"plm tokenize {cell(s, 'plm tokenize --num-proc 1 / encode_batch', 1)} encode_batch "
                   f"(goal ≥ {_goal(s, 'plm (one process)')})")),
    "tokenize-memory": (None, _tokenize_memory),
    "tokenize-memory-jsonl": (None, _tokenize_memory),
    "input-pipeline": (
        None,
        lambda s: (f"8 workers build {span(column(s, '8 workers (`auto`) ÷ GPU'))} what one H100 trains at 45% MFU "
                   "(goal ≥ 2×)")),
    "ernie-entity-units": (
        lambda s: "entity precision by occurrence, reviews / news: every proper-noun run {} / {}, jieba filter {} / {}, "
                  "THULAC-confirmed {} / {} (goal ≥ 0.80)".format(
            *column(s, "old precision")[:2], *column(s, "new precision")[:2], *column(s, "entities-thulac: precision")[:2]),
        None),
    # start-up and end to end
    "startup": (
        None,
        lambda s: (f"plm recipes {cell(s, 'plm recipes', 1)} ms, plm --help {cell(s, 'plm --help', 1)} ms "
                   "(goal < 1 s)")),
    "readme-command": (
        lambda s: "val ppl {}, held-out eval-ppl {}".format(
            *find(s, r"val loss [\d.]+ \(ppl ([\d.]+)\); eval-ppl ([\d.]+)")),
        lambda s: "command 1 {}; unit tests {}, .ci/run {}".format(
            find(s, r"→ (\d+ s) in all")[0], find(s, r"skipped in ([\d.]+ s); then")[0], find(s, r"; (\d+ s) \(\d+ min")[0])),
    "generate-cache": (
        lambda s: "greedy output byte-identical to recomputing",
        lambda s: "1,000 tokens from gpt-mini in {} instead of {} (medians of 3)".format(
            *(sorted(cell(s, "greedy, 1,000 new tokens (max_positions 256), 3 runs", c).split(", "),
                     key=lambda t: float(t.split()[0]))[1] for c in (2, 1)))),
    # GPU
    "gpu-mfu": (None, _gpu_mfu),
    "gpu-varlen": (None, _gpu_varlen),
    **{f"gpu-check-{part}": (None, _gpu_check) for part in ("syncs", "fp16", "workers", "resume", "checkpointing")},
}


# ---------------------------------------------------------------- the summary


def slug(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _escape(value: str) -> str:
    return value.replace("|", "\\|")


def sections(text: str) -> list[tuple[str, str, str]]:
    """(topic, name, body) of every benchmark section, in file order."""
    out = []
    for m in SECTION.finditer(text):
        topics = re.findall(r"^# (.+)$", text[:m.start()], re.M)
        out.append((topics[-1] if len(topics) > 1 else "", m[1], m[2]))
    return out


def render(text: str) -> str:
    """The summary block (markers included) that `text`'s sections give."""
    problems, groups = [], {}
    seen: dict[str, int] = {}

    def anchor(title: str) -> str:
        base = slug(title)
        n = seen.get(base, -1) + 1
        seen[base] = n
        return base if n == 0 else f"{base}-{n}"

    heads = {}
    for line in re.findall(r"^#{1,6} (.+)$", text, re.M):
        heads.setdefault(line, anchor(line))
    for topic, name, body in sections(text):
        if name in UNSUMMARISED:
            continue
        if name not in ROWS:
            problems.append(f"section {name!r} has no row: add one to ROWS in benchmarks/summary.py")
            continue
        title = re.search(r"^## (.+)$", body, re.M)
        if not title:
            problems.append(f"section {name!r} has no '## ' title")
            continue
        try:
            quality, speed = (f(body) if f else "—" for f in ROWS[name])
            cells = [f"[{name}](#{heads[title[1]]})", quality, speed, machine(body), date(body)]
        except Missing as e:
            problems.append(f"section {name!r}: did not find {e}; update its row in benchmarks/summary.py")
            continue
        groups.setdefault(topic, []).append("| " + " | ".join(_escape(c) for c in cells) + " |")
    if problems:
        raise Missing("\n".join(problems))
    out = [BEGIN, "<!-- generated by `python benchmarks/summary.py` from the sections below: edit those, not this -->"]
    for topic, rows in groups.items():
        out += ["", f"**[{topic}](#{heads[topic]})**" if topic in heads else f"**{topic}**", "",
                "| benchmark | quality | speed / cost | machine | date |", "|---|---|---|---|---|", *rows]
    return "\n".join(out + ["", END])


def current(text: str) -> str:
    """The summary block as it stands in `text`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise Missing(f"the markers {BEGIN} and {END} in BENCHMARKS.md")
    return text[start:end + len(END)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = BENCHMARKS_MD.read_text(encoding="utf-8")
    try:
        new = render(text)
        old = current(text)
    except Missing as e:
        print(f"summary: {e}", file=sys.stderr)
        return 2
    if "--check" in argv:
        if new != old:
            print("summary: BENCHMARKS.md's summary is stale: run `python benchmarks/summary.py`", file=sys.stderr)
            return 1
        return 0
    if new != old:
        BENCHMARKS_MD.write_text(text.replace(old, new), encoding="utf-8")
        print(f"summary: rewrote the summary of {BENCHMARKS_MD}")
    else:
        print("summary: already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
