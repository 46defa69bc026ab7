"""`plm attention`: what each head looks at (Clark et al. 2019, "What Does BERT Look At?").

Per layer × head, averaged over the query positions that are real tokens (token-weighted over a
whole --corpus; padding is neither a query nor a key):
    entropy   −Σ_j α_ij ln α_ij in nats (§3.3: broad vs focused heads)
    next      α_i,i+1 (queries with a next token)           previous  α_i,i−1 (queries with one before)
    cls       Σ α_ij over [CLS] keys                         sep       Σ α_ij over [SEP] keys
    self      α_ii
Encoders read [CLS] a [SEP] (b [SEP]) with segment ids, exactly as `plm finetune` encodes them. A causal
LM reads the plain tokens of the text; its [CLS] column is the first token (where causal LMs' heads
often park attention), its [SEP] column the bos/eos tokens in the text (n/a when the tokenizer has neither),
and `next` is n/a: causal attention cannot see it. Row i of a causal head spreads over i + 1 keys
only, so its entropy is at most ln(i + 1): early rows pull a causal head's entropy down.
Layers and heads are numbered from 1, as in the paper.

The probabilities come from models.layers.record_attention, so every family whose self-attention is
a layers.MultiHeadAttention (BERT, RoBERTa, ALBERT, ELECTRA's discriminator, SpanBERT, NEZHA, GPT) is
covered without code of its own.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from plmcli.data.pairs import encode_framed, encoder_frame
from plmcli.errors import PlmError
from plmcli.models.base import Encodes, HasHidden, uses_token_types

PATTERNS = ("entropy", "next", "previous", "cls", "sep", "self")
MAX_SHOWN = 40
"""Tokens shown on a heatmap's axes; longer inputs are cut (and the title says so) to stay readable."""
FORMAT = "plm-attention"


# ------------------------------------------------------------------ which runs


def _kind(model_cls) -> str | None:
    """How a model is fed: "encoder" (encode(ids, types, mask)), "causal" (hidden(ids)), or None."""
    if model_cls.traits.bidirectional and issubclass(model_cls, Encodes):
        return "encoder"
    if model_cls.traits.causal and issubclass(model_cls, HasHidden):
        return "causal"
    return None


def _records_attention(family: str, model_cfg) -> bool:
    """The family can be fed and its self-attention is a MultiHeadAttention: built on the meta device
    (no memory, no time) to look at its modules."""
    from plmcli.models.layers import MultiHeadAttention
    from plmcli.models.registry import build_model, model_class

    if _kind(model_class(family)) is None:
        return False
    try:
        with torch.device("meta"):
            model = build_model(family, model_cfg)
    except Exception:  # a family that cannot be built from its defaults alone is not one we can vouch for
        return False
    return isinstance(model, torch.nn.Module) and any(isinstance(m, MultiHeadAttention) for m in model.modules())


def attention_families() -> list[str]:
    """The model families `attention` works on (checked on each family's default config)."""
    from plmcli.models.registry import FAMILIES, model_config_class

    found = []
    for family in FAMILIES:
        cfg = model_config_class(family)()
        cfg.vocab_size = 8
        if _records_attention(family, cfg):
            found.append(family)
    return found


# ------------------------------------------------------------------ inputs


@dataclass
class Encoded:
    ids: list[list[int]]
    """Each example's tokens as the model reads them."""
    type_start: list[int]
    """Where segment 1 starts in each row (= its length without a second segment)."""
    truncated: int
    """Examples cut to max_seq_len."""


def read_corpus(path: str, max_lines: int | None) -> list[tuple[str, str | None]]:
    """Non-blank lines of `path`; a tab splits a line into a sentence pair (a, b)."""
    from plmcli.data.text import iter_text_lines

    examples = []
    for line in iter_text_lines([path]):
        if not line.strip():
            continue
        a, tab, b = line.rstrip("\r\n").partition("\t")
        examples.append((a, b if tab else None))
        if max_lines and len(examples) >= max_lines:
            break
    if not examples:
        raise PlmError(f"--corpus {path} has no non-blank lines", "pass a text file, one sentence (or tab-separated pair) per line")
    return examples


def encode_examples(tok, special_ids: dict, examples, kind: str, max_seq_len: int, layout: str = "cls_first") -> Encoded:
    """Encoders: finetuning's rows ([CLS] a [SEP] (b [SEP]) in the encoder's layout); causal LMs: the plain tokens."""
    rows, starts, truncated = [None] * len(examples), [0] * len(examples), 0
    if kind == "causal":
        enc = tok.encode_batch([a if b is None else f"{a}\t{b}" for a, b in examples], add_special_tokens=False)
        for i, e in enumerate(enc):
            rows[i] = e.ids[:max_seq_len]
            starts[i] = len(rows[i])
            truncated += len(e.ids) > max_seq_len
        return Encoded(rows, starts, truncated)
    frame = encoder_frame(layout, special_ids["cls"], special_ids["sep"])
    for paired in (False, True):  # encode_framed takes all singles or all pairs
        idx = [i for i, (_, b) in enumerate(examples) if (b is not None) == paired]
        if not idx:
            continue
        a = [examples[i][0] for i in idx]
        b = [examples[i][1] for i in idx] if paired else None
        enc = encode_framed(tok, frame, a, b, max_seq_len)
        off = enc["offsets"]
        for k, i in enumerate(idx):
            rows[i] = enc["ids"][off[k]:off[k + 1]].tolist()
            starts[i] = int(enc["type_start"][k])
        truncated += int(enc["truncated"].sum())
    return Encoded(rows, starts, truncated)


def _batch(enc: Encoded, order: list[int], pad: int, device):
    """Right-padded (B, T) ids, segment ids and a 1/0 mask of the rows in `order`."""
    T = max(len(enc.ids[i]) for i in order)
    ids = torch.full((len(order), T), pad, dtype=torch.long)
    for r, i in enumerate(order):
        ids[r, :len(enc.ids[i])] = torch.tensor(enc.ids[i])
    lengths = torch.tensor([len(enc.ids[i]) for i in order])
    pos = torch.arange(T)
    mask = pos[None, :] < lengths[:, None]
    types = mask & (pos[None, :] >= torch.tensor([enc.type_start[i] for i in order])[:, None])
    return ids.to(device), types.long().to(device), mask.long().to(device)


# ------------------------------------------------------------------ statistics


class PatternSums:
    """Running sums of the six patterns per layer × head, and how many queries each is averaged over."""

    def __init__(self):
        self.sums: dict[str, dict[int, torch.Tensor]] = {}  # pattern -> layer -> (H,) sums
        self.counts: dict[str, float] = {}

    def add(self, maps: list[torch.Tensor], real: torch.Tensor, cls_keys: torch.Tensor | None,
            sep_keys: torch.Tensor | None, causal: bool) -> None:
        """maps: per layer (B, H, T, T) probabilities; real (B, T) bool, right padding; cls_keys / sep_keys
        (B, T) bool: the keys each of those patterns counts (None: n/a)."""
        q = real[:, None, :].float()  # (B, 1, T): real query rows
        n = float(real.sum())
        counts = {"entropy": n, "self": n, "previous": float(real[:, 1:].sum())}
        both = (real[:, :-1] & real[:, 1:])[:, None, :].float()  # queries whose next token is real
        if not causal:
            counts["next"] = float(both.sum())
        counts |= {name: n for name, keys in (("cls", cls_keys), ("sep", sep_keys)) if keys is not None}
        for layer, A in enumerate(maps):  # one layer at a time: (L, B, H, T, T) at once can be gigabytes
            terms = {"entropy": (torch.special.entr(A).sum(-1), q),
                     "self": (A.diagonal(dim1=-2, dim2=-1), q),
                     "previous": (A.diagonal(-1, dim1=-2, dim2=-1), q[..., 1:])}  # α_{i+1, i}: queries 1..T−1
            if not causal:
                terms["next"] = (A.diagonal(1, dim1=-2, dim2=-1), both)  # α_{i, i+1}
            for name, keys in (("cls", cls_keys), ("sep", sep_keys)):
                if keys is not None:
                    terms[name] = ((A @ keys[:, None, :, None].to(A.dtype)).squeeze(-1), q)  # Σ_j α_ij over those keys
            for name, (values, weight) in terms.items():
                total = (values * weight).double().sum(dim=(0, 2))  # (B, H, T) -> (H,)
                self.sums.setdefault(name, {})[layer] = self.sums.get(name, {}).get(layer, 0.0) + total.cpu()
        for name, count in counts.items():
            self.counts[name] = self.counts.get(name, 0.0) + count

    def rows(self) -> list[dict]:
        """One dict per layer × head: layer, head (from 1) and each pattern's mean (None = n/a)."""
        def mean(p, layer, head):
            return float(self.sums[p][layer][head] / self.counts[p]) if self.counts.get(p) else None

        first = self.sums["entropy"]
        return [{"layer": layer + 1, "head": h + 1, **{p: mean(p, layer, h) for p in PATTERNS}}
                for layer in sorted(first) for h in range(len(first[layer]))]


def summarize(rows: list[dict]) -> dict:
    """Per pattern, the head that shows it most: {pattern: {layer, head, value}} (None when n/a);
    for entropy the broadest head, and the sharpest as entropy_min."""
    out = {}
    for p in PATTERNS:
        have = [r for r in rows if r[p] is not None]
        best = max(have, key=lambda r: r[p]) if have else None
        out[p] = {"layer": best["layer"], "head": best["head"], "value": best[p]} if best else None
    low = min(rows, key=lambda r: r["entropy"])
    out["entropy_min"] = {"layer": low["layer"], "head": low["head"], "value": low["entropy"]}
    return out


# ------------------------------------------------------------------ the command


def attention(run: str | None, text: str | None = None, text_pair: str | None = None, corpus: str | None = None,
              out: str | None = None, max_seq_len: int | None = None, batch_size: int = 16,
              max_lines: int | None = None) -> dict:
    """Attention heatmaps (OUT/layer_{i}.png, of `text`, else the corpus' first line) and the six
    patterns per head (OUT/attention.tsv, OUT/attention.json) over `text` or every line of `corpus`."""
    from plmcli.data.store import build_atomically
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.runs import load_encoder

    _check_options(text, text_pair, corpus, out, batch_size, max_lines)
    path, cfg, kind, layout = _open_run(run, text_pair)
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    examples = read_corpus(corpus, max_lines) if corpus else [(text, text_pair)]
    if kind == "causal":  # a tab read from a corpus line is part of the text
        examples = [(a if b is None else f"{a}\t{b}", None) for a, b in examples]
    shown = (text, text_pair) if text is not None else examples[0]

    tok = load_tokenizer(path / "tokenizer.json")
    model = load_encoder(path, cfg).eval()
    L = max_seq_len or model.max_positions
    if not 4 <= L <= model.max_positions:
        raise PlmError(f"--max-seq-len {L} is outside 4..{model.max_positions} (the model's positions)",
                       f"use --max-seq-len ≤ {model.max_positions}")
    enc = encode_examples(tok, special_ids, examples, kind, L, layout)
    if any(not r for r in enc.ids):
        raise PlmError("a text encodes to no tokens", "pass text the run's tokenizer can read")
    runner = Recorder(model, kind, special_ids)
    sums = PatternSums()
    by_length = sorted(range(len(enc.ids)), key=lambda i: -len(enc.ids[i]))  # little padding per batch
    for lo in range(0, len(by_length), batch_size):
        runner.add_to(sums, enc, by_length[lo:lo + batch_size])
    rows = sums.rows()
    one = encode_examples(tok, special_ids, [shown], kind, L, layout) if corpus else enc  # the heatmaps' text
    shown_maps = runner(one, [0])[2]
    tokens = [_label(tok.id_to_token(i)) for i in one.ids[0]]
    causal = kind == "causal"
    targets = {"cls": "first token", "sep": "/".join(dict.fromkeys(tok.id_to_token(i) for i in runner.boundary)) or "bos/eos"} \
        if causal else {"cls": tok.id_to_token(special_ids["cls"]), "sep": tok.id_to_token(special_ids["sep"])}
    result = {
        "format": FORMAT, "run": str(path), "family": cfg["family"], "causal": causal,
        "text": shown[0], "text_pair": shown[1], "corpus": str(Path(corpus).resolve()) if corpus else None,
        "examples": len(enc.ids), "query_tokens": int(sum(len(r) for r in enc.ids)), "truncated": enc.truncated,
        "max_seq_len": L, "n_layer": len(shown_maps), "n_head": int(shown_maps[0].shape[1]), "targets": targets,
        "heads": rows, "summary": summarize(rows),
        "figures": [f"layer_{i + 1}.png" for i in range(len(shown_maps))], "tokens": tokens,
    }

    def build(tmp: Path) -> dict:
        for i, m in enumerate(shown_maps):
            draw_layer(m[0].cpu().numpy(), tokens, i + 1, tmp / f"layer_{i + 1}.png")
        (tmp / "attention.tsv").write_text(to_tsv(rows), encoding="utf-8")
        (tmp / "attention.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return result

    build_atomically(Path(out), "", _read_meta, build, "plm attention", force=True)
    return {**result, "out_dir": str(out)}


def _check_options(text, text_pair, corpus, out, batch_size, max_lines) -> None:
    if not out:
        raise PlmError("no output directory given", "pass --out DIR (it receives layer_{i}.png, attention.tsv, attention.json)")
    if text is not None and not text.strip():
        raise PlmError("the text is empty", 'pass the text to look at, e.g. plm attention RUN "the cat sat on the mat" --out att/')
    if text is None and corpus is None:
        raise PlmError("no text given", "pass a TEXT argument, or --corpus FILE (one sentence or tab-separated pair per line)")
    if text_pair is not None and (text is None or not text_pair.strip()):
        raise PlmError("--text-pair needs a non-empty second text and a first TEXT",
                       'e.g. plm attention RUN "a question" --text-pair "its answer" --out att/')
    if batch_size < 1 or (max_lines is not None and max_lines < 1):
        raise PlmError("--batch-size and --max-lines must be ≥ 1", "e.g. --batch-size 16")
    out_dir = Path(out)  # checked now, not after the model has run (build_atomically checks again)
    if out_dir.exists() and not (out_dir.is_dir() and (not any(out_dir.iterdir()) or _read_meta(out_dir))):
        raise PlmError(f"'{out_dir}' exists and is not a `plm attention` output", "choose another --out directory (plm will not overwrite it)")


def _open_run(run: str | None, text_pair: str | None):
    """(run dir, its config.json, "encoder" | "causal", [CLS] layout), or PlmError for a run we cannot read."""
    from plmcli.config import build_section
    from plmcli.models.registry import model_class, model_config_class
    from plmcli.runs import resolve_run, run_config

    path = resolve_run(run, "plm attention RUN")
    cfg = run_config(path)
    family, label = cfg["family"], run or f"runs/latest ({path.resolve().name})"
    cls = model_class(family)
    kind = _kind(cls)
    if kind is None or not _records_attention(family, build_section(model_config_class(family), cfg["model"], "model")):
        raise PlmError(f"run {label} is {family}, whose attention plm cannot record",
                       f"use a run of a family built on plm's self-attention layers: {', '.join(attention_families())}")
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    if kind == "causal" and text_pair is not None:
        raise PlmError(f"--text-pair: run {label} is a causal LM ({family}), which reads one plain text",
                       "join the two texts into TEXT, or use an encoder run for sentence pairs")
    if kind == "encoder" and not {"cls", "sep"} <= set(special_ids):
        raise PlmError(f"run {label}'s tokenizer has no cls / sep token to build [CLS] a [SEP] inputs from",
                       "use an encoder run whose tokenizer defines the cls and sep roles (bert recipes do)")
    return path, cfg, kind, cls.traits.pair_layout or "cls_first"


def _read_meta(d: Path) -> dict | None:
    """attention.json of an earlier `plm attention` output in `d`, else None."""
    try:
        meta = json.loads((d / "attention.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


class Recorder:
    """Runs batches of encoded rows through the model and hands back every layer's attention."""

    def __init__(self, model, kind: str, special_ids: dict):
        self.model, self.causal, self.special_ids = model, kind == "causal", special_ids
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.to(self.device)
        # One segment embedding (RoBERTa) or none: as the task heads, no segment ids then.
        self.use_types = uses_token_types(model)
        self.pad = special_ids.get("pad", 0)
        self.boundary = [special_ids[r] for r in ("bos", "eos") if r in special_ids]

    def __call__(self, enc: Encoded, order: list[int]):
        """(ids (B, T), real-token mask (B, T), per layer (B, H, T, T) probabilities) of rows `order`."""
        from plmcli.models.layers import record_attention

        ids, types, mask = _batch(enc, order, self.pad, self.device)
        with torch.no_grad(), record_attention() as maps:
            if self.causal:  # right padding: a causal row never sees the pads after it
                self.model.hidden(ids)
            else:
                self.model.encode(ids, types if self.use_types else None, mask)
        return ids, mask.bool(), [m.float() for m in maps]

    def add_to(self, sums: PatternSums, enc: Encoded, order: list[int]) -> None:
        ids, real, maps = self(enc, order)
        if self.causal:
            cls_keys = torch.zeros_like(real)
            cls_keys[:, 0] = True
            sep_keys = torch.isin(ids, torch.tensor(self.boundary, device=ids.device)) & real if self.boundary else None
        else:
            cls_keys = (ids == self.special_ids["cls"]) & real
            sep_keys = (ids == self.special_ids["sep"]) & real
        sums.add(maps, real, cls_keys, sep_keys, self.causal)


# ------------------------------------------------------------------ output


def _label(token: str | None) -> str:
    """A token as a tick label: visible spaces, and no mathtext ($ would start a formula)."""
    token = "∅" if token is None else token.replace(" ", "␣") or "∅"
    return token.replace("$", r"\$")


def draw_layer(maps: np.ndarray, tokens: list[str], layer: int, path: Path) -> Path:
    """One layer's heads (H, T, T) as a grid of heatmaps, one shared 0..1 colorbar. Every head of a layer
    reads the same tokens, so only the left column and each column's lowest panel carry the labels
    (matplotlib lays out each tick label one by one: on every panel, BERT-base took ~20 s a layer)."""
    from plmcli.analysis.figures import pyplot, save_png

    plt = pyplot()
    H, T = maps.shape[0], maps.shape[-1]
    n = min(T, MAX_SHOWN)
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    panel = max(3.0, 0.17 * n + 1.0)  # inches: 8 pt labels stay apart at 110 dpi
    # "compressed": constrained layout that packs fixed-aspect panels without gaps
    fig, axes = plt.subplots(rows, cols, figsize=(cols * panel + 1.5, rows * (panel + 0.3) + 0.6), squeeze=False,
                             layout="compressed")
    im = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # glyphs missing from the default font (CJK) are drawn as boxes
        for h, ax in enumerate(axes.flat):
            if h >= H:
                ax.axis("off")
                continue
            im = ax.imshow(maps[h, :n, :n], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_title(f"layer {layer} — head {h + 1}", fontsize=10)
            if h + cols >= H:  # no panel below
                ax.set_xticks(range(n), tokens[:n], rotation=90, fontsize=8)
                ax.set_xlabel("attends to", fontsize=9)
            else:
                ax.set_xticks([])
            if h % cols == 0:
                ax.set_yticks(range(n), tokens[:n], fontsize=8)
                ax.set_ylabel("query token", fontsize=9)
            else:
                ax.set_yticks([])
        cut = f" — first {n} of {T} tokens shown" if T > n else ""
        fig.suptitle(f"layer {layer}: attention of each head{cut}", fontsize=12)
        fig.colorbar(im, ax=axes, shrink=0.8, label="attention probability")
        return save_png(fig, path)


def _fmt(v, digits: int = 4) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def to_tsv(rows: list[dict]) -> str:
    lines = ["\t".join(("layer", "head") + PATTERNS)]
    lines += ["\t".join([str(r["layer"]), str(r["head"])] + [_fmt(r[p], 6) for p in PATTERNS]) for r in rows]
    return "\n".join(lines) + "\n"


def summary_lines(res: dict) -> list[str]:
    """One line per pattern naming the head that shows it most, e.g. "[SEP]: layer 3 head 2, 0.81"."""
    names = {"entropy": "entropy", "next": "next token", "previous": "previous token",
             "cls": res["targets"]["cls"], "sep": res["targets"]["sep"], "self": "self"}
    lines = []
    for p in PATTERNS:
        s = res["summary"][p]
        if s is None:
            why = "causal attention cannot see it" if p == "next" else "the tokenizer has no such token"
            lines.append(f"{names[p]}: n/a ({why})")
        elif p == "entropy":
            low = res["summary"]["entropy_min"]
            lines.append(f"entropy: broadest layer {s['layer']} head {s['head']}, {s['value']:.2f} nats; "
                         f"sharpest layer {low['layer']} head {low['head']}, {low['value']:.2f} nats")
        else:
            lines.append(f"{names[p]}: layer {s['layer']} head {s['head']}, {s['value']:.2f}")
    return lines


def print_report(res: dict, console=None) -> None:
    """The per-head table and the summary lines, on a rich console."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    t = {k: escape(v) for k, v in res["targets"].items()}  # "[CLS]" is a token here, not rich markup
    what = f"{res['examples']} lines of {res['corpus']}" if res["corpus"] else "the text"
    table = Table("layer", "head", "entropy (nats)", "next", "previous", f"→ {t['cls']}", f"→ {t['sep']}", "self",
                  title=f"{res['family']} attention over {what} ({res['query_tokens']:,} tokens)")
    for r in res["heads"]:
        table.add_row(str(r["layer"]), str(r["head"]), _fmt(r["entropy"], 2), *(_fmt(r[p], 3) for p in PATTERNS[1:]))
    console.print(table)
    for line in summary_lines(res):
        console.print(line, markup=False, highlight=False)
    cut = f" ({res['truncated']} cut to {res['max_seq_len']} tokens)" if res["truncated"] else ""
    console.print(f"{res['out_dir']}: {len(res['figures'])} heatmaps, attention.tsv, attention.json{cut}", markup=False,
                  highlight=False)
