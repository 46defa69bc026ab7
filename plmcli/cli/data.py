"""`plm tokenize` and `plm make-mlm-data`: the commands that prepare corpora."""

from __future__ import annotations

from typing import List, Optional

import typer

from plmcli.cli._common import Commands, floats, print_json
from plmcli.config_schema import field_docs
from plmcli.data.masking_options import MaskingOptions
from plmcli.errors import PlmError

MASKING_HELP = {k: " ".join(v.split()) for k, v in field_docs(MaskingOptions).items()}
"""The help of make-mlm-data's --mask-count and --ngram-start-prob: their fields' docstrings, as the recipe keys'."""

commands = Commands()


# ---------------------------------------------------------------- tokenize


@commands.command()
def tokenize(
    inputs: List[str] = typer.Argument(..., help="Text files, directories of them, .gz files, - for stdin; JSON Lines / "
                                       "JSON / CSV / Parquet files, a save_to_disk directory, or a Hub dataset NAME[:CONFIG[:SPLIT]] "
                                       "(each row a document; a DatasetDict's train split, and its validation split as validation)."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (tokenizer.json, dataset/, meta.json)."),
    tokenizer: Optional[str] = typer.Option(None, help="wordpiece | bpe | bytelevel-bpe | unigram | char | word, "
                                            "or a tokenizer.json to load (default: the recipe's, else bytelevel-bpe)."),
    vocab_size: Optional[int] = typer.Option(None, help="Vocabulary size to train (default 8192, or the recipe's)."),
    min_frequency: Optional[int] = typer.Option(None, help="Minimum count of a piece to enter the vocabulary."),
    lowercase: Optional[bool] = typer.Option(None, "--lowercase/--no-lowercase", help="Lower-case the text first."),
    special_tokens: Optional[str] = typer.Option(None, help="Roles to tokens, e.g. 'cls=[CLS],sep=[SEP],mask=[MASK],pad=[PAD],unk=[UNK]' "
                                          "(default: the recipe's, else the kind's usual ones: wordpiece BERT's, unigram ALBERT's "
                                          "<pad> <unk> [CLS] [SEP] [MASK], others GPT-2's <|endoftext|>)."),
    recipe: Optional[str] = typer.Option(None, help="Take the tokenizer settings (kind, size, special tokens) from this recipe."),
    doc_per_line: bool = typer.Option(False, help="Each line is a document (default: blank lines separate documents)."),
    split_sentences: bool = typer.Option(False, help="Cut lines into sentences at 。！？ and . ! ? (text that is not one "
                                         "sentence per line: NSP/SOP pairs are built from sentences)."),
    val_fraction: float = typer.Option(0.05, help="Share of documents (from the end) kept for validation (0 = none)."),
    num_proc: int = typer.Option(1, help="Worker processes for encoding."),
    text_column: Optional[str] = typer.Option(None, "--text-column", help="The text column of JSON Lines / CSV / Parquet files, "
                                              "saved datasets and Hub datasets (default: text)."),
    force: bool = typer.Option(False, help="Rebuild even when the cache matches."),
    as_json: bool = typer.Option(False, "--json", help="Print meta.json."),
):
    """Train (or load) a tokenizer and encode a corpus into an Arrow dataset.

    Example: plm tokenize wiki/ books.txt.gz --out data/tok --tokenizer wordpiece --vocab-size 30522 --recipe bert-base

    Example: plm tokenize wikitext:wikitext-103-raw-v1 --out data/wt103 --tokenizer bytelevel-bpe

    Example: plm tokenize docs.jsonl --text-column body --out data/docs
    """
    from plmcli import api

    specials = None
    if special_tokens:
        try:
            specials = dict(item.split("=", 1) for item in special_tokens.split(","))
        except ValueError:
            raise PlmError(f"--special-tokens '{special_tokens}' is not role=token,…", "e.g. --special-tokens 'eos=<|endoftext|>'") from None
    meta = api.tokenize(inputs, out, tokenizer, vocab_size, min_frequency, lowercase, specials, recipe,
                        doc_per_line, val_fraction, num_proc, force, split_sentences=split_sentences,
                        text_column=text_column or "text")
    if as_json:
        return print_json(meta)
    c = meta["counts"]
    typer.echo(f"{out}: {c['train']['documents']:,} train / {c['validation']['documents']:,} validation documents, "
               f"{c['train']['tokens'] + c['validation']['tokens']:,} tokens, vocab {meta['tokenizer']['vocab_size']:,}")


# ---------------------------------------------------------------- make-mlm-data


def packing_of(packing: str | None, cross_documents: bool | None) -> str:
    """make-mlm-data's --packing, given itself or by its older flags (--no-cross-documents is doc_sentences)."""
    if cross_documents is None:
        return packing or "full_sentences"
    old = "full_sentences" if cross_documents else "doc_sentences"
    if packing not in (None, old):
        flag = "--cross-documents" if cross_documents else "--no-cross-documents"
        raise PlmError(f"{flag} (the older name of --packing {old}) contradicts --packing {packing}",
                       f"drop {flag}")
    return old


@commands.command("make-mlm-data")
def make_mlm_data(
    corpus: str = typer.Argument(..., help="A `plm tokenize` output directory."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (dataset/, meta.json, tokenizer.json)."),
    max_seq_len: int = typer.Option(128, help="Tokens per instance, [CLS] and [SEP]s included."),
    short_seq_prob: float = typer.Option(0.1, help="Share of instances with a shorter random target length."),
    dupe_factor: int = typer.Option(5, help="Copies of the corpus, each masked differently."),
    mask_prob: float = typer.Option(0.15, help="Share of tokens to predict."),
    max_predictions: int = typer.Option(20, help="At most this many predictions per instance (0 = no cap)."),
    pairs: str = typer.Option("nsp", help="nsp (next sentence) | sop (sentence order) | none (RoBERTa full-sentence packing)."),
    packing: Optional[str] = typer.Option(None, help="--pairs none: full_sentences packs across documents (RoBERTa's "
                                          "FULL-SENTENCES, the default) | doc_sentences keeps each instance inside one "
                                          "document (DOC-SENTENCES)."),
    cross_documents: Optional[bool] = typer.Option(None, "--cross-documents/--no-cross-documents",
                                                   help="Older names of --packing full_sentences / doc_sentences."),
    masking: str = typer.Option("token", help="token | wwm (whole word) | ngram (1-4 words, 40/30/20/10) | ngram_per_word "
                                "(a 1-4-word span decided at each word) | chinese-wwm (jieba words) | span (SpanBERT) | "
                                "knowledge (ERNIE: whole --lexicon matches, or --knowledge-units)."),
    span_p: float = typer.Option(0.2, help="--masking span: span length in words ~ Geometric(p), p in (0, 1]."),
    span_max: int = typer.Option(10, help="--masking span: longest span, in words (≥ 1)."),
    lexicon: Optional[str] = typer.Option(None, help="--masking knowledge: phrases or entities, one per line; each match is masked whole."),
    knowledge_units: Optional[str] = typer.Option(None, help="--masking knowledge without --lexicon: phrases | entities | "
                                                  "entities-thulac, found in the text by jieba's part-of-speech tagger (ERNIE's "
                                                  "phrase / entity stage; entities-thulac: each entity confirmed by THULAC, plm[zh-ner])."),
    ngram_probs: str = typer.Option("0.4,0.3,0.2,0.1", help="--masking ngram, ngram_per_word: P(1 word), P(2 words), ... comma-separated "
                                    "(ALBERT: 0.5455,0.2727,0.1818)."),
    ngram_start_prob: Optional[float] = typer.Option(None, help=MASKING_HELP["ngram_start_prob"]),
    mask_count: str = typer.Option("reference", help=MASKING_HELP["mask_count"]),
    seed: int = typer.Option(12345, help="Random seed: the output is deterministic for a seed."),
    num_proc: int = typer.Option(1, help="Worker processes."),
    force: bool = typer.Option(False, help="Rebuild even when the cache matches."),
    as_json: bool = typer.Option(False, "--json", help="Print meta.json."),
):
    """Create static masked-LM instances with BERT's create_pretraining_data semantics.

    80% of the chosen tokens become [MASK], 10% a random token, 10% stay; [CLS]/[SEP] are never masked.

    Example: plm make-mlm-data tok/ --out mlm128 --max-seq-len 128 --max-predictions 20 --masking wwm --pairs nsp

    ERNIE's entity masking: plm make-mlm-data tok/ --out ent --masking knowledge --lexicon entities.txt
    (or --knowledge-units entities: the entities jieba's tagger finds)
    """
    from plmcli import api

    meta = api.make_mlm_data(corpus, out, max_seq_len, short_seq_prob, dupe_factor, mask_prob, max_predictions,
                             pairs, masking, seed, num_proc, force, span_p=span_p, span_max=span_max, lexicon=lexicon,
                             ngram_probs=floats(ngram_probs, "--ngram-probs"), packing=packing_of(packing, cross_documents),
                             knowledge_units=knowledge_units, mask_count=mask_count, ngram_start_prob=ngram_start_prob)
    if as_json:
        return print_json(meta)
    c = meta.get("counts", {})
    typer.echo(f"{out}: " + ", ".join(f"{k} {v.get('instances', v) if isinstance(v, dict) else v:,}" for k, v in c.items()))
