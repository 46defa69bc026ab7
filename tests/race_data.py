"""Hand-written, clearly synthetic RACE articles and the folder layout of the RACE download, shared by the RACE
reader, objective and zero-shot tests."""

import json
from pathlib import Path


ARTICLES = [  # synthetic passages written for these tests
    {"article": "Tom keeps a small garden behind his house. Every morning he waters the tomatoes before school.",
     "questions": ["What does Tom grow?", "When does he water them?"],
     "options": [["Roses", "Tomatoes", "Apples", "Corn"], ["At night", "At noon", "Every morning", "Never"]],
     "answers": ["B", "C"], "id": "high1.txt"},
    {"article": "The library opens at nine. Children may borrow three books each week.",
     "questions": ["How many books may a child borrow each week?"],
     "options": [["One", "Two", "Three", "Ten"]], "answers": ["C"], "id": "middle7.txt"},
    {"article": "Mia rode her bike to the lake and fed the ducks some bread.",
     "questions": ["Mia went to the lake _ ."],
     "options": [["by bus", "on foot", "by car", "by bike"]], "answers": ["D"], "id": "middle9.txt"},
]


def write_race_dir(root: Path, splits=("train", "dev", "test"), articles=ARTICLES) -> Path:
    """RACE's download layout: SPLIT/high/*.txt and SPLIT/middle/*.txt, one JSON article per file."""
    for split in splits:
        for a in articles:
            level = "high" if a["id"].startswith("high") else "middle"
            path = root / split / level / a["id"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(a), encoding="utf-8")
    return root

TEXTS = [a["article"] for a in ARTICLES] + [q for a in ARTICLES for q in a["questions"]] + \
    [o for a in ARTICLES for opts in a["options"] for o in opts]
"""Every text of the articles: a corpus for tiny tokenizers and models."""
