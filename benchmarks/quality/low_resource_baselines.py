"""The low-resource benchmark's references on the same rows: scikit-learn baselines (a bag-of-words logistic
regression; a per-token logistic regression over word features for NER) and a probe of a pretrained network's
frozen states, each scored as plm's task code scores a finetune."""

from __future__ import annotations

import json
import warnings
from pathlib import Path


def texts_labels(task_name: str, data: Path):
    """(train texts, train labels, dev texts, dev labels) as plm's task reads them."""
    from plmcli.data.tasks.registry import get_task

    task = get_task("classification" if task_name == "chnsenticorp" else task_name)
    splits = task.load(str(data))
    return ([e.text_a for e in splits["train"]], [e.label for e in splits["train"]],
            [e.text_a for e in splits["dev"]], [e.label for e in splits["dev"]])


def bag_of_words(task_name: str, data: Path, seed: int) -> float:
    """Dev accuracy of a logistic regression on binary word uni+bigram counts (characters for Chinese), its
    inverse regularisation C chosen by 5-fold cross-validation on the training rows alone."""
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegressionCV

    xs, ys, dev_x, dev_y = texts_labels(task_name, data)
    analyzer = "char" if task_name == "chnsenticorp" else "word"
    words = {"token_pattern": r"(?u)\b\w+\b|[^\w\s]"} if analyzer == "word" else {}
    vec = CountVectorizer(analyzer=analyzer, ngram_range=(1, 2), binary=True, lowercase=True, **words)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # scikit-learn 1.8's notices of coming default changes
        clf = LogisticRegressionCV(Cs=8, cv=5, max_iter=2000, scoring="accuracy", random_state=seed)
        clf.fit(vec.fit_transform(xs), ys)
    return float((clf.predict(vec.transform(dev_x)) == np.asarray(dev_y)).mean())


def word_features(words: list[str], i: int) -> dict:
    """A token's features: the word, its lower case, shape, affixes, and the same for its neighbours."""
    def shape(w):
        s = "".join("X" if c.isupper() else "x" if c.islower() else "d" if c.isdigit() else c for c in w)
        return "".join(c for k, c in enumerate(s) if k == 0 or c != s[k - 1])

    f = {"bias": 1.0}
    for off in (-2, -1, 0, 1, 2):
        j = i + off
        w = words[j] if 0 <= j < len(words) else ("<s>" if j < 0 else "</s>")
        f[f"{off}:lower={w.lower()}"] = 1.0
        f[f"{off}:shape={shape(w)}"] = 1.0
        if off == 0:
            f[f"word={w}"] = 1.0
            for k in (1, 2, 3, 4):
                f[f"pre{k}={w[:k]}"] = f[f"suf{k}={w[-k:]}"] = 1.0
            f["title"], f["upper"], f["digit"] = float(w.istitle()), float(w.isupper()), float(any(c.isdigit() for c in w))
            f["first"] = float(i == 0)
    return f


def token_classifier(data: Path, seed: int) -> float:
    """Dev entity F1 (plm's CoNLL scorer: seqeval) of a per-token logistic regression over word features (no CRF,
    each tag predicted alone)."""
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression

    from plmcli.data.tasks.registry import get_task

    task = get_task("conll2003")
    splits = task.load(str(data))
    feats = lambda sents: [word_features(s.words, i) for s in sents for i in range(len(s.words))]  # noqa: E731
    vec = DictVectorizer()
    x = vec.fit_transform(feats(splits["train"]))
    y = [t for s in splits["train"] for t in s.tags]
    clf = LogisticRegression(C=1.0, max_iter=2000, random_state=seed).fit(x, y)
    flat = clf.predict(vec.transform(feats(splits["dev"]))).tolist()
    preds, k = [], 0
    for s in splits["dev"]:
        preds.append(flat[k:k + len(s.words)])
        k += len(s.words)
    return float(task.score(preds, [s.tags for s in splits["dev"]])["f1"])


def layer_probe(root: Path, data: Path, seed: int) -> dict:
    """What a frozen encoder's states hold for the task before finetuning: dev accuracy of a logistic regression
    (C by 5-fold CV on the training rows) on each layer's mean-pooled states (layer 0 = the embedding output),
    from the pretrained run and from random init. Cached in root/probe.json."""
    import numpy as np
    import torch
    from sklearn.linear_model import LogisticRegressionCV

    from plmcli.config_sections import TaskOptions
    from plmcli.data.tasks.registry import get_task
    from plmcli.models.base import HasLayerStates
    from plmcli.objectives.heads import token_states
    from plmcli.runs import load_encoder, load_run_tokenizer, run_config, task_objective

    done = root / "probe.json"
    if done.is_file():
        return json.loads(done.read_text())
    run = root / "pretrain-en" / "pretrain"
    cfg, task, out = run_config(run), get_task("sst2", TaskOptions()), {}
    for init in ("pretrained", "random"):
        enc = load_encoder(run, cfg, pretrained=init == "pretrained", seed=seed).eval()
        obj = task_objective(task, load_run_tokenizer(run, cfg), cfg["tokenizer"]["special_token_ids"], 128,
                             type(enc), 0.0)
        if not (root / "probe-data" / "meta.json").is_file():
            obj.encode_splits(task.load(str(data)), root / "probe-data")
        feats = {}
        for split in ("train", "validation"):
            stream, xs, ys = obj.stream(root / "probe-data", split, 128, 0, 0, 1, shuffle=False), [], []
            with torch.no_grad():
                for k in range(stream.batches_per_epoch()):
                    b = stream[k]
                    mask = b["attention_mask"].unsqueeze(-1).float()
                    args = (b["input_ids"], b["token_type_ids"], b["attention_mask"])
                    # word vectors have one "layer": what a task head reads
                    layers = (enc.layer_states(*args) if isinstance(enc, HasLayerStates)
                              else [token_states(enc, *args)[0]])
                    xs.append([((h * mask).sum(1) / mask.sum(1)).numpy() for h in layers])
                    ys.append(b["labels"].numpy())
            feats[split] = [np.concatenate(layer) for layer in zip(*xs)], np.concatenate(ys)
        accs = []
        for (x, y), (dx, dy) in zip(((x, feats["train"][1]) for x in feats["train"][0]),
                                    ((x, feats["validation"][1]) for x in feats["validation"][0])):
            mu, sd = x.mean(0), x.std(0) + 1e-6
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                clf = LogisticRegressionCV(Cs=6, cv=5, max_iter=3000, scoring="accuracy").fit((x - mu) / sd, y)
            accs.append(float((clf.predict((dx - mu) / sd) == dy).mean()))
        out[init] = accs
    done.write_text(json.dumps(out))
    return out
