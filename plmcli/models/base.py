"""What a model family is and what it can do, declared in one place.

Every family class subclasses `LanguageModel` and declares its `traits` (a frozen `Traits`: a misspelt
trait is a TypeError at import, not a flag that silently reads as False). Optional abilities — fitting by
counting, HF conversion, hidden states for transfer, FLOP counts, ... — are `typing.Protocol`s: callers ask
`isinstance(model, Fits)` or `issubclass(cls, ExportsHF)` instead of probing attributes.

Who reads what:
- objectives check the pretraining heads a model has (`masked_lm`, `permutation_lm`, ...);
- plmcli.eval picks the perplexity scorer named by `scoring`;
- finetuning, export templates, attention and probing build pair inputs by `pair_layout`;
- task heads are served to `bidirectional` encoders (`encode`), stateless `causal` LMs (`hidden`) and families
  whose per-token states read one example at a time (`HasTokenStates`), summarised as their `pooling` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from torch import nn

PairLayout = Literal["cls_first", "cls_last", "causal"]
"""How a text pair becomes one input: `[CLS] a [SEP] b [SEP]` (BERT), `a <sep> b <sep> <cls>` (XLNet),
`<s> a $ b <e>` (GPT's transfer)."""

Pooling = Literal["cls", "last", "concat", "mean", "cnn"]
"""How a sequence task head (classification, pair, regression, multiple choice) reads one row's states:
cls     the encoder's pooled [CLS] state (BERT)
last    the final state of the last real token, <e> (GPT-style transfer, Radford et al. 2018 §3.3)
concat  [last; max-pool; mean-pool] over the real tokens (ULMFiT's concat pooling, Howard & Ruder 2018 §3.3)
mean    the mean of the real tokens' states (an encoder without a [CLS] of its own: a translation encoder)
cnn     Kim's (2014) convolutions over the states, max over the row (objectives.heads.ConvPooling): states that do
        not see their neighbours (word2vec's vectors), whose order a mean would lose"""

Scoring = Literal["window", "fixed_context", "state", "memory", "counts", "conditional", "pseudo",
                  "left_to_right", "bidirectional_lm"]
"""The perplexity protocol plmcli.eval uses for a family:
window         sliding windows, every token scored once (GPT)
fixed_context  every token sees exactly its n-1 predecessors (the feed-forward NNLM)
state          one stream, the hidden state carried across the whole file (RNN/LSTM/GRU)
memory         segments of tgt_len, each attending to mem_len cached states (Transformer-XL)
counts         sentence by sentence from count tables (n-gram)
conditional    target given source, or each line given itself (encoder–decoders)
pseudo         pseudo-perplexity, one masked token at a time (masked LMs, ELECTRA)
left_to_right  the identity factorisation order of a permutation LM (XLNet)
bidirectional_lm  forward, backward and their average (ELMo)"""


@dataclass(frozen=True)
class Traits:
    """What a family is. Defaults describe nothing: a family sets what holds for it."""

    causal: bool = False
    """Predicts each token from the ones before it (objective clm / bptt; generation)."""
    bidirectional: bool = False
    """An encoder: `encode(ids, types, mask) -> (hidden (B, T, C), pooled (B, C) | None)` sees both sides;
    finetuning puts task heads on it."""
    stateful: bool = False
    """forward takes and returns a state (hidden state or memory) that objectives carry across batches."""
    has_memory: bool = False
    """Segment memory with mem_len / tgt_len (Transformer-XL, XLNet): eval-ppl's memory and segment-length options apply."""
    counts: bool = False
    """Fit by counting, no gradient (n-gram): trains through `Fits.fit`, not the loop."""
    seq2seq: bool = False
    """An encoder–decoder: forward(src, tgt) (objectives seq2seq / denoise; translation)."""
    masked_lm: bool = False
    """forward returns BertOutput (mlm_logits at mlm_positions, nsp_logits): objective mlm's model."""
    replaced_token_detection: bool = False
    """A generator and a discriminator (ELECTRA): objective rtd's model."""
    permutation_lm: bool = False
    """Two-stream attention (XLNet): objective plm's model."""
    bilm: bool = False
    """Forward and backward LMs over shared token representations (ELMo): objective bilm's model."""
    pair_layout: PairLayout | None = None
    """None: derived — `causal` for causal LMs, `cls_first` for bidirectional encoders."""
    scoring: Scoring | None = None
    """The perplexity protocol (see `Scoring`); None: the family has no perplexity."""
    pooling: Pooling | None = None
    """What a sequence task head reads (see `Pooling`); None: derived — `cls` for bidirectional encoders,
    `last` for causal LMs. Which primitive gives the states: `Encodes`, `HasHidden` or `HasTokenStates`."""
    head_layers: int = 0
    """Hidden layers (Linear → ReLU → dropout, the features' width) between a sequence head's pooled features and
    its output layer (span heads have none, taggers only with a `tag_window`, `cnn` pooling none: its convolutions
    are the hidden layer): 0, the output layer alone (BERT, GPT); 2 under word2vec's window tagger."""
    tag_window: int = 0
    """Collobert et al.'s (2011) window approach: a tagger reads the states of words i−w … i+w concatenated, each
    with its capitalization feature (an embedding of the word's letter case), under the head_layers. For states
    that do not see their neighbours (word2vec's vectors); 0: each word's own state alone."""

    def __post_init__(self):
        if self.pair_layout is None:
            derived = "causal" if self.causal and not self.bidirectional else "cls_first" if self.bidirectional else None
            object.__setattr__(self, "pair_layout", derived)
        if self.pooling is None:
            object.__setattr__(self, "pooling", "cls" if self.bidirectional else "last" if self.causal else None)


class LanguageModel(nn.Module):
    """The base of every family class (one per file in plmcli/models, listed in models/registry.py)."""

    Config: ClassVar[type]
    """The family's typed model section (a dataclass)."""
    traits: ClassVar[Traits] = Traits()
    hf_model_types: ClassVar[tuple[str, ...]] = ()
    """transformers `model_type`s that `plm import` converts into this family."""
    probe_layers: ClassVar[str | tuple[str, ...] | None] = None
    """Where plmcli.analysis.hidden reads each layer's output: a ModuleList's dotted path, or ALBERT's
    (attention, ffn) pair of shared modules; None: the family has no per-layer states to probe."""
    tiny: ClassVar[tuple[str, ...]] = ()
    """`--set` overrides that shrink any of the family's recipes (or its Config's defaults, through the `model.`
    keys) to a seconds-sized model at vocabulary 50 reading 16 tokens, plus the `objective.` / `data.` keys its
    objective needs at that size. Every family-wide test builds each registered family from these alone (the recipe,
    conformance and skip-init suites), so a new family brings its own and a subclass inherits its parent's."""

    def embedding_tables(self) -> list[nn.Parameter]:
        """The weights whose size follows the vocabulary rather than the network's capacity: every nn.Embedding's
        table (a family that keeps its tables as bare parameters, word2vec's v and v', names them itself)."""
        return [m.weight for m in self.modules() if isinstance(m, nn.Embedding)]


# ---------------------------------------------------------------- optional abilities


@runtime_checkable
class Fits(Protocol):
    """Trained by counting over a tokenized corpus, outside the gradient loop (n-gram)."""

    def fit(self, data_dir, recipe, run_dir, console=None) -> dict: ...


@runtime_checkable
class LoadsRunWeights(Protocol):
    """Weights whose shapes depend on the data (count tables): loaded from the run directory by the model."""

    def load_run_weights(self, run_dir) -> None: ...


@runtime_checkable
class WritesArpa(Protocol):
    def write_arpa(self, path): ...


@runtime_checkable
class ExportsHF(Protocol):
    """Converts to and from a transformers checkpoint (config dict, state dict). `plm export` converts the model at
    its tokenizer's vocabulary (plmcli.models.vocab: without_padding), so `to_hf` never sees padding rows."""

    def to_hf(self, run_config: dict) -> tuple[dict, dict]: ...

    @classmethod
    def from_hf(cls, hf_config: dict, state_dict: dict) -> tuple[Any, dict]: ...


@runtime_checkable
class ExportsHFExtras(Protocol):
    """Second networks exported beside the main one (ELECTRA's generator), by subdirectory."""

    def hf_extra_exports(self, run_config: dict) -> dict[str, tuple[dict, dict]]: ...


@runtime_checkable
class HasHFExportNotes(Protocol):
    """What an HF export cannot carry (SpanBERT's SBO head, ...), said to the user."""

    def hf_export_notes(self) -> list[str]: ...


@runtime_checkable
class ExportsHFSequenceClassification(Protocol):
    def to_hf_sequence_classification(self, run_config: dict, head: nn.Linear) -> tuple[dict, dict]: ...


@runtime_checkable
class CountsFlops(Protocol):
    """FLOPs per trained token, for the time estimate and MFU."""

    def flops_per_token(self, seq_len: int) -> float: ...


@runtime_checkable
class CheckpointsActivations(Protocol):
    """A Transformer whose blocks can recompute their activations in backward instead of keeping them
    (train.activation_checkpointing; plmcli.models.checkpointing): on, training keeps each block's inputs only."""

    def checkpoint_activations(self, on: bool) -> None: ...


@runtime_checkable
class TakesTokenStrings(Protocol):
    """Needs the vocabulary's strings (ELMo's character CNN spells each token)."""

    def set_token_strings(self, strings: list[str]) -> None: ...


@runtime_checkable
class HasHidden(Protocol):
    """A causal LM's last-layer states for transfer: hidden(ids (B, T)) -> (B, T, C)."""

    def hidden(self, input_ids): ...


@runtime_checkable
class Encodes(Protocol):
    """A bidirectional encoder: encode(ids, types, mask) -> (hidden (B, T, C), pooled (B, C) | None)."""

    def encode(self, input_ids, token_type_ids=None, attention_mask=None): ...


@runtime_checkable
class HasTaskHead(Protocol):
    """Feature-based transfer: the family builds its own task head over frozen features (ELMo's scalar mix)."""

    def task_head(self, num_labels: int, dropout: float | None = None) -> nn.Module: ...


# ---------------------------------------------------------------- what task heads read from a model


def head_dropout(model: nn.Module) -> float:
    """Dropout before a task head when the task sets none: the family's own `dropout`; 0.1 (BERT's) for a
    family whose config has none."""
    return getattr(model.cfg, "dropout", 0.1)


def head_init_std(model: nn.Module) -> float:
    """The std of a task head's N(0, std) weights: the family's `init_std`; 0.02 (BERT's initializer_range)
    for a family whose config has none."""
    return getattr(model.cfg, "init_std", 0.02)


def uses_token_types(model: nn.Module) -> bool:
    """Whether segment ids reach the model: a `type_vocab_size` of 2 or more (families without one count as
    2). RoBERTa's 1 (or 0): pairs are told apart by [SEP] alone, every token is segment 0."""
    return getattr(model.cfg, "type_vocab_size", 2) >= 2


# ---------------------------------------------------------------- what generation, analysis and training ask


@runtime_checkable
class HasPositionLimit(Protocol):
    """Learned or fixed positions up to `max_positions`: generation crops a causal LM's context to it and
    bounds an encoder–decoder's output by it. A model without one (RNN, n-gram) reads any length."""

    @property
    def max_positions(self) -> int: ...


@runtime_checkable
class RecordsAttention(Protocol):
    """Self-attention that models.layers.record_attention captures (plm's MultiHeadAttention, NEZHA's relative one
    too) in every layer its `encode` (an encoder) or `hidden` (a causal LM) runs: `plm attention` draws those maps.
    `attention_modules()`: those modules, in the order they run. Declared, not detected: a family on attention of
    its own (Transformer-XL's, XLNet's two streams) records nothing, whatever modules it happens to hold."""

    def attention_modules(self) -> list[nn.Module]: ...


@runtime_checkable
class AdaptsAttention(Protocol):
    """A family whose attention calls every Linear layer as its module, so a layer put in its place (peft's LoRA, a
    quantised linear) runs: `adapter_modules()` lists the attention modules whose Linear layers LoRA adapts by default
    (train/lora.py). Wider than RecordsAttention: Transformer-XL's and XLNet's own attention records no maps."""

    def adapter_modules(self) -> list[nn.Module]: ...


@runtime_checkable
class CarriesStateBatch(Protocol):
    """A stateful model whose carried state has its batch on dimension `state_batch_dim` (Transformer-XL's
    memories: 0). A stateful model without it carries RNN states, (layers, B, H): dimension 1."""

    state_batch_dim: int


@runtime_checkable
class CachesKeysValues(Protocol):
    """A causal Transformer that decodes incrementally, each layer's keys and values kept (GPT): `empty_cache(batch)`
    is the cache of no positions; `decode_cached(ids (B, T), positions (B, T), cache, keep)` reads T new tokens at
    those positions (each < max_positions) after the cached ones -> ((B, V) next-token logits after each row's last
    new token, the cache with the T positions added). `keep` (B, cached + T): False at padding, whose keys no
    position attends. The cache is a list of per-layer (keys, values), each (B, H, positions, D): beam search
    reorders it along dim 0."""

    def empty_cache(self, batch: int) -> list: ...

    def decode_cached(self, input_ids, positions, cache: list, keep=None): ...


@runtime_checkable
class HasGenerationSession(Protocol):
    """Decodes in a vocabulary of its own (n-gram words, counted on the CPU): `generation_session(prompt ids)`
    gives the session generation drives (logits / push / select), which names its `eos` and `decode`s."""

    def generation_session(self, prompts: list[list[int]]): ...


# ---------------------------------------------------------------- reading the declaration


def traits_of(model) -> Traits:
    """The traits of a model or model class; `Traits()` (nothing) for any other object, so that a check such as
    `traits_of(m).causal` refuses a plain nn.Module the way it refuses a family without the trait."""
    cls = model if isinstance(model, type) else type(model)
    return cls.traits if issubclass(cls, LanguageModel) else Traits()


@runtime_checkable
class HasLMHead(Protocol):
    """An output layer a task head can reuse: lm_head(hidden (B, T, C)) -> (B, T, V) (GPT's auxiliary LM loss)."""

    lm_head: nn.Module


@runtime_checkable
class HasTokenStates(Protocol):
    """Per-token states for transfer, each row read alone: token_states(ids (B, T), mask (B, T)) -> (B, T, C).

    A stateful LM starts every row from a fresh state (RNNs: zeros; Transformer-XL: an empty memory), so an
    example's features never depend on the examples batched or read before it; rows are right-padded and
    no real position may see the padding. Tagging reads every token's state, sequence heads pool them as
    `Traits.pooling` says."""

    def token_states(self, input_ids, attention_mask=None): ...


@runtime_checkable
class HasStateLogits(Protocol):
    """Next-token logits of `token_states`' states: state_logits(states (B, T, C)) -> (B, T, V) (log-probabilities
    are valid logits), for GPT-style transfer's auxiliary LM loss on a stateful LM."""

    def state_logits(self, states): ...


@runtime_checkable
class HasWordVectors(Protocol):
    """Static word vectors (word2vec): `word_vectors(token strings by id)` -> (the words that have a vector, most
    frequent first; their vectors, an (n, dim) float32 array). `plm export --format word2vec` writes them and
    `plm eval-vectors` scores them."""

    def word_vectors(self, token_strings: list[str]) -> tuple[list[str], Any]: ...


@runtime_checkable
class HasLayerStates(Protocol):
    """Every layer's per-token states for feature-based transfer (Devlin et al. 2018 §5.3; Peters et al. 2018):
    layer_states(ids (B, T), types, mask) -> [h_0, h_1, ..., h_L], each (B, T, C): h_0 the embedding output,
    h_j layer j's output, h_L exactly the states the family's task heads read by default (`encode`'s hidden,
    `hidden`, `token_states`; a final LayerNorm included). An RNN LM's list is its layers' outputs alone (its
    embeddings have another width). Read with the same per-row rules as those
    (padding never reaches a real position). `--features scalar_mix | concat_last_four` read them."""

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list: ...
