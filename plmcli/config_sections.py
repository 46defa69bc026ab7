"""Typed recipe sections. Attribute docstrings double as the reference in `plm recipes show --help`.

A field's allowed values are declared in its type, and config.build_section checks them when a recipe
(or a run's config.json) is loaded: `Literal[...]` for a choice, `Annotated[int, Range(1)]` for an
interval, `Divides("d_model")` for a count that must split another field (attention heads), `Rule` for
another condition between fields of a section (what a model's constructor would refuse). The name
lists of the settings that pick an implementation (optimizer, schedule, tokenizer) live here, at the
bottom, so a recipe is checked against them before anything is built.

`plm finetune`'s config has its own four sections (task, model, train, optim: the Finetune* classes at
the end), checked by the same machinery; `TaskOptions`, the part of the task section the tasks read, is
re-exported by plmcli.data.tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Optional, Union


@dataclass(frozen=True)
class Range:
    """The interval a number must lie in; None = unbounded on that side."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def holds(self, v, values: dict) -> bool:
        return ((self.lo is None or (v > self.lo if self.lo_open else v >= self.lo))
                and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)))

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '≥'} {self.lo:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


@dataclass(frozen=True)
class Divides:
    """An integer that must divide the field `other` of the same section (heads split the hidden size),
    unless the field `unless` is set (a model with an explicit head size)."""

    other: str
    unless: str | None = None

    def holds(self, v, values: dict) -> bool:
        return bool(self.unless and values.get(self.unless)) or values[self.other] % v == 0


@dataclass(frozen=True)
class Rule:
    """A condition a field must meet that reads other fields of its section too (what a family's constructor
    would otherwise refuse with a ValueError, after the data is tokenized): `test(value, values)` with
    `values` every field of the section. The error reads "<key> <value> <says>" and its hint is `hint`
    (without one: the field's default), both formatted with the section's values and `where` (its name)."""

    test: Callable[[Any, dict], bool]
    says: str
    hint: str = ""

    def holds(self, v, values: dict) -> bool:
        try:
            return bool(self.test(v, values))
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError):  # a malformed value fails it
            return False


@dataclass(frozen=True)
class OrAuto:
    """A number in `range`, or the word auto: chosen when the run starts (the field's docstring says how)."""

    range: Range

    def holds(self, v, values: dict) -> bool:
        return v == "auto" or (not isinstance(v, str) and self.range.holds(v, values))

    def __str__(self) -> str:
        return f"{self.range} or auto"


@dataclass(frozen=True)
class Folded:
    """A choice also read case-blind and without surrounding spaces ("AdamW" is adamw), as the optimizer
    and schedule names were before their fields became choices."""


Size = Annotated[int, Range(1)]
"""A count or width that must be ≥ 1."""
Count = Annotated[int, Range(0)]
"""≥ 0, where 0 means none, off, or "take it from elsewhere" (the field's docstring says which)."""
Seed = Annotated[int, Range(0)]
"""A random seed ≥ 0: numpy's generators refuse a negative one, and would only once training has started."""
Workers = Annotated[Union[int, str], OrAuto(Range(0))]
"""A count of worker processes ≥ 0, or auto (picked from the device and the cores the run has)."""
Probability = Annotated[float, Range(0, 1, hi_open=True)]
"""Dropout and other rates: 0 ≤ p < 1 (p = 1 would drop or replace everything)."""
Fraction = Annotated[float, Range(0, 1)]
"""A share: 0 ≤ x ≤ 1."""
Positive = Annotated[float, Range(0, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Heads = Annotated[int, Range(1), Divides("d_model")]
"""Attention heads: each gets d_model / n_head of the hidden size."""
OptimizerName = Literal["adamw", "adam", "lamb", "sgd"]
"""optim.name: what train/optim.build_optimizer builds."""
ScheduleName = Literal["linear", "cosine", "constant", "inverse-sqrt", "polynomial", "step"]
"""optim.schedule: what train/schedule.build_scheduler builds."""
MixedPrecision = Literal["auto", "no", "bf16", "fp16"]
"""train.mixed_precision: what the loop's Accelerator runs in."""
TokenizerKind = Literal["wordpiece", "bpe", "bytelevel-bpe", "unigram", "char", "word"]
"""tokenizer.kind: what data/tokenizers.train_tokenizer trains."""


@dataclass
class TokenizerConfig:
    kind: TokenizerKind = "bytelevel-bpe"
    """wordpiece | bpe | bytelevel-bpe | unigram | char | word (whitespace words; each CJK ideograph a word)."""
    vocab_size: Size = 8192
    """Target vocabulary size, special tokens included (char/word: an upper bound)."""
    min_frequency: Count = 2
    """Pieces (or words, chars) seen fewer times than this are not added."""
    lowercase: bool = False
    """Lower-case (and for wordpiece, strip accents) before tokenizing."""
    segment: Literal["char", "jieba"] = "char"
    """word only — Chinese text: char = each CJK ideograph a word; jieba = jieba's words (the vocabulary is jieba's
    segmentation of the corpus, each unit scored by its frequency; text is cut into the most probable sequence of
    them, as jieba cuts by its dictionary)."""
    special_tokens: dict = field(default_factory=lambda: {"eos": "<|endoftext|>"})
    """Role -> token string, roles from: bos eos pad unk mask cls sep. The same string may fill several roles."""
    path: Optional[str] = None
    """Load this tokenizer.json instead of training one."""


@dataclass
class DataConfig:
    path: Optional[str] = None
    """Text file(s)/dir or a `plm tokenize` output dir; empty = the small corpus shipped with plm."""
    default_data: Optional[str] = None
    """The shipped sample (a file in plmcli/corpus/) used when neither --data nor path is given; empty = the objective's."""
    text_column: str = "text"
    """The column that holds the text in JSON Lines / CSV / Parquet files, saved datasets and Hub datasets."""
    doc_per_line: bool = False
    """Each line is a document (else documents are separated by blank lines and lines are sentences)."""
    split_sentences: bool = False
    """Cut lines into sentences at sentence-final punctuation (plmcli/data/sentences.py), for text that is not
    one sentence per line: NSP/SOP pairs and make-mlm-data's segments are built from those sentences."""
    val_fraction: Probability = 0.05
    """Share of documents (taken from the end of the corpus) held out for validation."""
    num_proc: Size = 1
    """Worker processes for tokenization."""


# ---------------------------------------------------------------- finetuning (config.FinetuneConfig)


@dataclass
class TaskOptions:
    """Task settings from `plm finetune`'s options; each task reads the ones that concern it.

    Their ranges are checked by the objectives that read them (naming the flag), not here: a finetuned
    run's config.json keeps these fields as they are."""

    train: str | None = None
    """A training file of the task's format (own data, SQuAD JSON, CoNLL, SWAG CSV), instead of --data-dir."""
    dev: str | None = None
    """The matching dev file (evaluated after every epoch; its main metric picks the best weights)."""
    test: str | None = None
    """An optional test file: predictions are written for it."""
    text_col: str | None = None
    """Own data: the column (TSV/CSV header or JSONL key) holding the text."""
    text_pair_col: str | None = None
    """Own data: the column of the second text of a pair."""
    label_col: str | None = None
    """Own data: the label column."""
    doc_stride: Size = 128
    """Span QA: tokens between the starts of consecutive windows over a long passage."""
    max_query_len: Size = 64
    """Span QA: question tokens kept."""
    max_answer_len: Size = 30
    """Span QA: longest answer decoded, in tokens."""
    n_best: Size = 20
    """Span QA: start and end candidates combined per window."""
    crf: bool = False
    """Token classification: a linear-chain CRF over the tag scores."""
    aux_lm_weight: NonNegative = 0.5
    """Causal runs (GPT-style transfer): λ of the auxiliary language-modelling loss."""


@dataclass
class FinetuneTaskConfig(TaskOptions):
    """finetune's `task` section: which task, where its data is, how long an example may be, and the
    TaskOptions the task itself reads."""

    name: Optional[str] = None
    """The task: GLUE (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli), squad, cmrc2018, conll2003, swag, race,
    or own data (classification, regression, pair-classification). Required, here or by --task."""
    data_dir: Optional[str] = None
    """The task's data folder (GLUE: holding SST-2/, CoLA/, ... or one task's folder; glue-sample: the SST-2
    sample shipped with plm); none = train/dev/test, else the Hub."""
    max_seq_len: Optional[Annotated[int, Range(8)]] = None
    """Tokens per example, special tokens included; none = min(128, the model's positions)."""


FinetuneFeatures = Literal["last", "scalar_mix", "concat_last_four"]
"""model.features: what the task head reads — the last layer (its pooled [CLS] where the encoder has a pooler),
a learned scalar mix γ·Σ softmax(s)_j h_j of every layer, embeddings included (ELMo eq. 1), or the last four
layers concatenated (BERT's best feature-based NER, Devlin et al. 2018 §5.3)."""

FinetuneInit = Literal["pretrained", "random"]
"""model.init: the run's weights, or the same architecture freshly initialised (the baseline that shows
what pretraining buys)."""


@dataclass
class FinetuneModelConfig:
    """finetune's `model` section: the run finetuned and what changes in it."""

    from_run: Optional[str] = None
    """The run directory finetuned (a pretrained run, or a finetuned one: its encoder); none = runs/latest."""
    init: FinetuneInit = "pretrained"
    """pretrained | random (same architecture, fresh weights: the baseline)."""
    dropout: Optional[Probability] = None
    """The backbone's dropout and attention dropout while finetuning; none = the run's own."""
    classifier_dropout: Optional[Probability] = None
    """Dropout before the task head; none = the backbone's dropout."""
    freeze: bool = False
    """Feature-based: the backbone's weights stay as pretrained (eval mode, no backward through it); only the
    task head (and a scalar mix) train."""
    features: FinetuneFeatures = "last"
    """last | scalar_mix | concat_last_four: what the head reads (scalar_mix and concat_last_four take the
    [CLS] position of the mixed states, not the pretrained pooler)."""
    elmo_at_output: bool = False
    """ELMo runs, sequence tasks: ELMo vectors also at the task BiLSTM's output, with their own scalar mix
    (Peters et al. 2018 §3.3)."""


@dataclass
class FinetuneTrainConfig:
    """finetune's `train` section (Devlin et al. 2018 §4.1: dev evaluated after every epoch, best weights kept)."""

    epochs: Optional[Size] = None
    """Epochs; dev is evaluated after each and the best weights are kept. none = chosen from the backbone's size
    (plmcli.pipelines.finetune.size_defaults): 3 (Devlin et al.) for BERT-base-size models, more for small ones."""
    batch_size: Size = 32
    """Examples per optimizer step, over all processes."""
    micro_batch_size: Count = 0
    """Examples per forward pass on one device; 0 = the whole batch (no accumulation)."""
    max_steps: Optional[Size] = None
    """Stop after this many optimizer steps instead of full epochs (also the schedule's horizon)."""
    eval_every: Count = 0
    """Evaluate dev (keeping the best weights) every N steps; 0 = after every epoch."""
    log_every: Count = 0
    """Log loss and lr every N steps; 0 = four times an epoch (at most every 50 steps)."""
    seed: Seed = 42
    """Seeds the head init, data order and dropout."""
    grad_clip: NonNegative = 1.0
    """Clip the global gradient norm to this; 0 disables."""
    mixed_precision: MixedPrecision = "auto"
    """auto | no | bf16 | fp16. auto: bf16 on a GPU that has it, else fp32."""
    activation_checkpointing: bool = False
    """Keep only each Transformer block's input for backward and recompute the block's activations there (one
    more forward: ~1/3 more compute per step): a large backbone, a long max_seq_len or a bigger micro_batch_size
    then fits in GPU memory. Turn it on when a step runs out of memory; the gradients are the same."""


@dataclass
class FinetuneOptimConfig:
    """finetune's `optim` section: AdamW, linear warmup then linear decay to 0 (Devlin et al.)."""

    name: Annotated[OptimizerName, Folded()] = "adamw"
    """adamw | adam | lamb | sgd."""
    lr: Optional[Positive] = None
    """Peak learning rate. none = chosen from the backbone's size (plmcli.pipelines.finetune.size_defaults): 2e-5
    (Devlin et al.) for BERT-base-size models, higher for small ones (Turc et al. 2019)."""
    weight_decay: NonNegative = 0.01
    """Decoupled weight decay (never on biases or norm weights)."""
    warmup_ratio: Probability = 0.1
    """Share of the steps spent warming the learning rate up."""
    schedule: Annotated[ScheduleName, Folded()] = "linear"
    """linear | cosine | constant | inverse-sqrt | polynomial | step: the decay after the warmup."""


def _distinct_positive(values, _) -> bool:
    return all(v > 0 for v in values) and len(set(values)) == len(values)


@dataclass
class FinetuneGridConfig:
    """finetune's `grid` section: Devlin et al.'s finetuning protocol (2018, §A.3: lr ∈ {5e-5, 4e-5, 3e-5, 2e-5},
    epochs ∈ {2, 3, 4}, batch ∈ {16, 32}; random restarts on small data sets), every combination finetuned into
    OUT/grid/<lr>-<epochs>-<batch>-seed<k>/ and the best dev run kept as OUT. An empty list tries the one value
    of the train/optim section; a grid of one run is a plain finetune."""

    lr: Annotated[list[float], Rule(_distinct_positive, "must be distinct learning rates > 0",
                                    "e.g. --set {where}.lr=[5.0e-5,3.0e-5,2.0e-5]")] = field(default_factory=list)
    """Peak learning rates tried; empty = optim.lr alone."""
    epochs: Annotated[list[int], Rule(_distinct_positive, "must be distinct epoch counts ≥ 1",
                                      "e.g. --set {where}.epochs=[2,3,4]")] = field(default_factory=list)
    """Epoch counts tried; empty = train.epochs alone."""
    batch_size: Annotated[list[int], Rule(_distinct_positive, "must be distinct batch sizes ≥ 1",
                                          "e.g. --set {where}.batch_size=[16,32]")] = field(default_factory=list)
    """Batch sizes tried; empty = train.batch_size alone."""
    seeds: Size = 1
    """Runs of each setting, seeded train.seed, train.seed + 1, …: the best dev run of all is kept."""
