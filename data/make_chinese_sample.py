"""Rebuild chinese-sample.txt and its two ERNIE lexicons from CMRC 2018 (see README.md).

    python data/make_chinese_sample.py ../shared/data/chinese/cmrc2018/cmrc2018_dev.json

The corpus: the dev-set contexts (Chinese Wikipedia paragraphs) in file order, one document per context,
one sentence per line (split after 。！？), documents separated by blank lines, until the next document
would pass MAX_BYTES. The lexicons come from jieba 0.42.1's part-of-speech tagger (jieba.posseg, HMM on)
run over each sentence of that corpus:
- entities: maximal runs of consecutive words tagged nr (person), ns (place) or nt (organisation),
  joined (e.g. 美国 + 加州 -> 美国加州), at least 2 characters, seen at least twice;
- phrases: maximal runs of at least 2 consecutive words tagged as nouns (n, nr, ns, nt, nz, ng, vn) or
  as modifiers that may open a noun phrase (a, an, b), ending with a noun, at most 12 characters, seen at
  least twice — a crude noun-phrase chunker in the spirit of ERNIE's chunking step.
Each lexicon line is `text<TAB>tag<TAB>count` (the tag of an entity is its first word's), most frequent first.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

MAX_BYTES = 290_000
HERE = Path(__file__).resolve().parent
ENTITY = {"nr", "ns", "nt"}
NOUN = {"n", "nr", "ns", "nt", "nz", "ng", "vn"}
MODIFIER = {"a", "an", "b"}
SENTENCE = re.compile(r"[^。！？]+[。！？]?[」”』）]*")


def documents(path: str):
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    for article in data:
        for para in article["paragraphs"]:
            sents = [s.strip() for s in SENTENCE.findall(para["context"]) if s.strip()]
            if len(sents) >= 2:
                yield sents


def runs(tagged, inside, last_ok=lambda flag: True):
    """Maximal runs of consecutive (word, flag) with flag in `inside`; yields (text, first flag, words)."""
    cur = []
    for word, flag in tagged + [("", "x")]:
        if flag in inside:
            cur.append((word, flag))
            continue
        while cur and not last_ok(cur[-1][1]):
            cur.pop()
        if cur:
            yield "".join(w for w, _ in cur), cur[0][1], len(cur)
        cur = []


def main(cmrc_dev: str) -> None:
    import jieba
    import jieba.posseg as pseg

    jieba.setLogLevel(60)
    docs, size = [], 0
    for sents in documents(cmrc_dev):
        text = "\n".join(sents)
        if size + len(text.encode("utf-8")) + 2 > MAX_BYTES:
            break
        docs.append(sents)
        size += len(text.encode("utf-8")) + 2
    (HERE / "chinese-sample.txt").write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")

    entities, phrases, tags = collections.Counter(), collections.Counter(), {}
    for sents in docs:
        for s in sents:
            tagged = [(p.word, p.flag) for p in pseg.lcut(s)]
            for text, flag, _ in runs(tagged, ENTITY):
                if len(text) >= 2:
                    entities[text] += 1
                    tags.setdefault(("e", text), flag)
            for text, flag, n in runs(tagged, NOUN | MODIFIER, last_ok=lambda f: f in NOUN):
                if n >= 2 and len(text) <= 12:
                    phrases[text] += 1
                    tags.setdefault(("p", text), "np")
    for name, counts, kind in (("entities", entities, "e"), ("phrases", phrases, "p")):
        rows = [f"{t}\t{tags[(kind, t)]}\t{c}" for t, c in sorted(counts.items(), key=lambda x: (-x[1], x[0])) if c >= 2]
        (HERE / f"chinese-sample-{name}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
        print(f"{name}: {len(rows)}")
    print(f"documents: {len(docs)}, bytes: {size}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(HERE.parent.parent / "shared/data/chinese/cmrc2018/cmrc2018_dev.json"))
