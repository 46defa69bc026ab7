"""What `plm attention` writes and prints: a heatmap per layer (the attention maps of one text), a heatmap
per pattern (layer × head, one panel each in patterns.png), attention.tsv, attention.json, and the table with its summary lines."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np

from plmcli.analysis.attention_stats import BROAD, PATTERNS

MAX_SHOWN = 40
"""Tokens shown on a heatmap's axes; longer inputs are cut (and the title says so) to stay readable."""
MAX_ANNOTATED = 64
"""Pattern panels with at most this many heads print each head's value in its cell (matplotlib lays out
each text on its own: 12 panels of BERT-base's 144 heads took ~10 s; attention.tsv has every value)."""

PATTERNS_PNG = "patterns.png"
TITLES = {
    "entropy": "entropy (nats; uniform attention: {uniform:.2f})",
    "next": "attention to the next token", "previous": "attention to the previous token",
    "cls": "attention to {cls}", "sep": "attention to {sep}", "self": "attention to the token itself",
    "same_token": "attention to the same token elsewhere", "same_token_other": "… in the other sentence",
    "same_word": "attention to the same word elsewhere", "same_word_other": "… in the other sentence",
    "same_word_pieces": "attention to the other pieces of its word",
    "punct": "attention to punctuation (Unicode P*)", "breadth": "entropy ÷ uniform's (red: broad, ≥ {broad:.0%})",
}
COLUMNS = {"entropy": "entropy (nats)", "next": "next", "previous": "previous", "cls": "→ {cls}", "sep": "→ {sep}",
           "self": "self", "same_token": "same token", "same_token_other": "… other sent.",
           "same_word": "same word", "same_word_other": "… other sent.", "same_word_pieces": "own word's pieces",
           "punct": "punct.", "breadth": "breadth"}


def tick_label(token: str | None) -> str:
    """A token as a tick label: visible spaces, and no mathtext ($ would start a formula)."""
    token = "∅" if token is None else token.replace(" ", "␣") or "∅"
    return token.replace("$", r"\$")


def write_outputs(tmp: Path, result: dict, shown_maps: list) -> dict:
    """Every file of an output directory into `tmp`: layer_{i}.png, patterns.png, attention.tsv/.json."""
    for i, m in enumerate(shown_maps):
        draw_layer(m[0].cpu().numpy(), result["tokens"], i + 1, tmp / f"layer_{i + 1}.png")
    draw_patterns(result, tmp / PATTERNS_PNG)
    (tmp / "attention.tsv").write_text(to_tsv(result["heads"]), encoding="utf-8")
    (tmp / "attention.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return result


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


def draw_patterns(res: dict, path: Path) -> Path:
    """Every pattern some head has a value for as a layer × head heatmap (Clark et al.'s per-head figures),
    one panel each in one figure (one figure, not one file per pattern: matplotlib's fixed cost per figure
    dominates at these sizes), one shared 0..1 colour scale; n/a heads blank, broad heads boxed in red.
    The entropy panel is coloured by entropy ÷ uniform attention's entropy and labelled in nats."""
    from plmcli.analysis.figures import pyplot, save_png

    plt = pyplot()
    L, H = res["n_layer"], res["n_head"]
    shown = [p for p in PATTERNS if any(r[p] is not None for r in res["heads"])]
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols)
    w, h = max(2.4, 0.35 * H + 1.2), max(2.0, 0.3 * L + 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * w + 1.2, rows * h + 0.6), squeeze=False, layout="constrained")
    uniform = res["uniform_entropy"] or 1.0
    im = None
    for k, ax in enumerate(axes.flat):
        if k >= len(shown):
            ax.axis("off")
            continue
        p = shown[k]
        grid = np.full((L, H), np.nan)
        for r in res["heads"]:
            if r[p] is not None:
                grid[r["layer"] - 1, r["head"] - 1] = r[p]
        colour = grid / uniform if p == "entropy" else grid
        im = ax.imshow(colour, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        if L * H <= MAX_ANNOTATED:
            for (i, j), v in np.ndenumerate(grid):
                if not np.isnan(v):  # dark text on the bright end of viridis, light on the dark end
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="black" if colour[i, j] > 0.6 else "white")
        if p in ("entropy", "breadth"):
            for b in res["broad_heads"]:
                ax.add_patch(plt.Rectangle((b["head"] - 1.5, b["layer"] - 1.5), 1, 1, fill=False, edgecolor="red", lw=1.5))
        ax.set_xticks(range(H), [str(x + 1) for x in range(H)], fontsize=7)
        ax.set_yticks(range(L), [str(x + 1) for x in range(L)], fontsize=7)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("layer", fontsize=7)
        ax.set_title(TITLES[p].format(**res["targets"], broad=BROAD, uniform=uniform), fontsize=8)
    fig.suptitle("attention patterns per layer × head", fontsize=10)
    fig.colorbar(im, ax=axes, shrink=0.8, label="share of attention (entropy: ÷ uniform attention's)")
    return save_png(fig, path)


def fmt(v, digits: int = 4) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def to_tsv(rows: list[dict]) -> str:
    lines = ["\t".join(("layer", "head") + PATTERNS)]
    lines += ["\t".join([str(r["layer"]), str(r["head"])] + [fmt(r[p], 6) for p in PATTERNS]) for r in rows]
    return "\n".join(lines) + "\n"


def _why_missing(res: dict, p: str) -> str:
    if p == "next":
        return "causal attention cannot see it"
    if p == "same_word_pieces":
        return "no word of the input is split into pieces"
    unit = "token" if p.startswith("same_token") else "word"
    if p in ("same_token", "same_word"):
        return f"no {unit} occurs twice in the input"
    if p in ("same_token_other", "same_word_other"):
        return ("a causal LM reads one text" if res["causal"] else
                f"no {unit} of one sentence recurs in the other: pass --text-pair or tab-separated pairs")
    return "the tokenizer has no such token"


def summary_lines(res: dict) -> list[str]:
    """One line per pattern naming the head that shows it most, e.g. "[SEP]: layer 3 head 2, 0.81"."""
    punct = " ".join(res["punctuation"][:12]) + (" …" if len(res["punctuation"]) > 12 else "")
    names = {"entropy": "entropy", "next": "next token", "previous": "previous token",
             "cls": res["targets"]["cls"], "sep": res["targets"]["sep"], "self": "self",
             "same_token": "same token elsewhere", "same_token_other": "same token in the other sentence",
             "same_word": "same word elsewhere", "same_word_other": "same word in the other sentence",
             "same_word_pieces": "other pieces of the same word", "punct": f"punctuation ({punct})"}
    lines = []
    for p in PATTERNS[:-1]:
        s = res["summary"][p]
        if p == "punct" and not res["punctuation"]:
            lines.append("punctuation: none in the input")
        elif s is None:
            lines.append(f"{names[p]}: n/a ({_why_missing(res, p)})")
        elif p == "entropy":
            low = res["summary"]["entropy_min"]
            lines.append(f"entropy: broadest layer {s['layer']} head {s['head']}, {s['value']:.2f} nats; "
                         f"sharpest layer {low['layer']} head {low['head']}, {low['value']:.2f} nats")
        else:
            lines.append(f"{names[p]}: layer {s['layer']} head {s['head']}, {s['value']:.2f}")
    return lines + [_broad_line(res)]


def _broad_line(res: dict) -> str:
    if not res["uniform_entropy"]:  # None, or 0 for a one-token causal text
        return "broad heads: n/a (one token: nothing to spread attention over)"
    head = f"broad heads (entropy ≥ {BROAD:.0%} of uniform attention's {res['uniform_entropy']:.2f} nats)"
    if not res["broad_heads"]:
        s = res["summary"]["breadth"]
        return f"{head}: none; the broadest, layer {s['layer']} head {s['head']}, reaches {s['value']:.0%}"
    shown = ", ".join(f"layer {b['layer']} head {b['head']} ({b['breadth']:.0%})" for b in res["broad_heads"][:8])
    more = f" and {len(res['broad_heads']) - 8} more" if len(res["broad_heads"]) > 8 else ""
    return f"{head}: {shown}{more}"


def print_report(res: dict, console=None) -> None:
    """The per-head tables (position and special tokens; recurrence, punctuation and breadth: two tables,
    each narrow enough for a terminal) and the summary lines, on a rich console."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    t = {k: escape(v) for k, v in res["targets"].items()}  # "[CLS]" is a token here, not rich markup
    what = f"{res['examples']} lines of {res['corpus']}" if res["corpus"] else "the text"
    first = PATTERNS[:PATTERNS.index("self") + 1]
    for k, group in enumerate((first, PATTERNS[len(first):])):
        title = f"{res['family']} attention over {what} ({res['query_tokens']:,} tokens)" if k == 0 else None
        table = Table("layer", "head", *(COLUMNS[p].format(**t) for p in group), title=title)
        for r in res["heads"]:
            table.add_row(str(r["layer"]), str(r["head"]), *(fmt(r[p], 2 if p == "entropy" else 3) for p in group))
        console.print(table)
    for line in summary_lines(res):
        console.print(line, markup=False, highlight=False)
    cut = f" ({res['truncated']} cut to {res['max_seq_len']} tokens)" if res["truncated"] else ""
    n_layer = sum(f.startswith("layer_") for f in res["figures"])
    console.print(f"{res['out_dir']}: {n_layer} layer heatmaps, {PATTERNS_PNG} (a heatmap per pattern), "
                  f"attention.tsv, attention.json{cut}", markup=False, highlight=False)
