"""`plm export --format hf` and `plm import`: plm runs <-> transformers model directories.

A family takes part through three members of its model class (see plmcli/models/bert.py):
`hf_model_types` (the HF config.json "model_type" values it imports), `to_hf(run_config)` -> (HF config
dict, HF state dict) and the classmethod `from_hf(hf_config, state_dict)` -> (our Config, our state dict).
Optional: `hf_export_notes()` (what the export leaves out, for the report) and
`to_hf_sequence_classification(run_config, head)` (a finetuned classifier as *ForSequenceClassification).
This driver finds them by scanning the model registry, so a family needs no line here.

plm does not depend on transformers: HF configs are plain JSON, weights go through safetensors and
tokenizers through `tokenizers`. Only local directories are read here; Hub model ids are fetched into one
by plmcli.interop.hub.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from plmcli.errors import PlmError

USAGE = "plm export RUN"
"""How export takes its run, for the run reader's hints."""

SPECIAL_INSERTERS = ("TemplateProcessing", "BertProcessing", "RobertaProcessing")
"""tokenizers post-processors that add [CLS]/[SEP]-style tokens: stripped on import, because plm's
objectives add special tokens themselves (plmcli.data.tokenizers)."""

BERT_DEFAULT_SPECIALS = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]",), "sep": ("[SEP]",),
                         "mask": ("[MASK]", "<mask>")}
"""Role tokens assumed when a checkpoint names none for the role but its vocabulary has one of these."""


# ---------------------------------------------------------------- the registry scan


def hf_families() -> dict[str, str]:
    """HF model_type -> plm family, from the `hf_model_types` of the registry's model classes."""
    from plmcli.models.registry import FAMILIES, model_class

    found: dict[str, str] = {}
    for family in FAMILIES:
        for model_type in model_class(family).hf_model_types:
            found.setdefault(model_type, family)
    return found


def exportable_families() -> list[str]:
    """Families whose model class converts to transformers (`ExportsHF`)."""
    from plmcli.models.base import ExportsHF
    from plmcli.models.registry import FAMILIES, model_class

    return [f for f in FAMILIES if issubclass(model_class(f), ExportsHF)]


# ---------------------------------------------------------------- export


def export_hf(run: str | None, out: str, force: bool = False) -> dict:
    """Write run `run` (default runs/latest) as a transformers directory `out`: config.json,
    model.safetensors and tokenizer files AutoTokenizer reads. Returns a report (architecture, notes)."""
    from safetensors.torch import save_file

    from plmcli.models.base import ExportsHF, ExportsHFExtras, ExportsHFSequenceClassification, HasHFExportNotes
    from plmcli.models.registry import model_class
    from plmcli.models.vocab import without_padding
    from plmcli.runs import load_run_tokenizer, resolve_run, run_config

    src = resolve_run(run, USAGE)
    cfg = run_config(src)
    family = cfg["family"]
    if not issubclass(model_class(family), ExportsHF):
        raise PlmError(f"run {run or 'runs/latest'} ({family}) cannot be exported for transformers",
                       f"families that can: {', '.join(exportable_families())}")
    dest = _check_out(out, force, src)
    model, head, notes = _export_model(src, cfg)
    model = without_padding(model)  # transformers' models have a row per token: a padded vocabulary is cut back
    hf_config, state_dict = None, None
    if head is not None and isinstance(model, ExportsHFSequenceClassification):
        try:
            hf_config, state_dict = model.to_hf_sequence_classification(cfg, head)
        except PlmError as e:
            notes.append(f"classifier not exported, encoder only: {e.message}")
    elif head is not None:
        notes.append(f"classifier not exported, encoder only: {family} has no transformers sequence-classification mapping")
    if hf_config is None:
        hf_config, state_dict = model.to_hf(cfg)
        notes += model.hf_export_notes() if isinstance(model, HasHFExportNotes) else []
    if not hf_config.get("model_type") or not hf_config.get("architectures"):
        raise ValueError(f"{type(model).__name__}.to_hf must return model_type and architectures")
    # Second networks a family ships beside the main one (ELECTRA's generator in generator/), each a
    # directory of its own that AutoModel… and AutoTokenizer load; built before anything is written.
    extras = model.hf_extra_exports(cfg) if head is None and isinstance(model, ExportsHFExtras) else {}
    files = hf_tokenizer_files(load_run_tokenizer(src, cfg), cfg, model)

    def write(tmp: Path) -> None:
        for d, (conf, sd) in [(tmp, (hf_config, state_dict))] + [(tmp / sub, v) for sub, v in extras.items()]:
            d.mkdir(exist_ok=True)
            (d / "config.json").write_text(json.dumps(conf, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
            for name, text in files.items():
                (d / name).write_text(text, encoding="utf-8")

    _replace_dir(dest, write)
    return {"out": str(dest), "run": str(src), "family": family, "model_type": hf_config["model_type"],
            "architecture": hf_config["architectures"][0], "extra": sorted(extras), "tensors": len(state_dict),
            "parameters": sum(t.numel() for t in state_dict.values()), "notes": notes}


def _export_model(src: Path, cfg: dict):
    """(backbone model in eval mode, the classifier's Linear head or None, notes) of a run."""
    from plmcli.runs import load_encoder, load_finetuned, load_run_model

    if not cfg.get("finetune"):
        return load_run_model(src, cfg), None, []
    from plmcli.objectives.classify import SequenceClassifier

    task = cfg["finetune"].get("task")
    task_model = load_finetuned(str(src), USAGE)[0]
    # a head over mixed or concatenated layers (--features) has no transformers class either
    if isinstance(task_model, SequenceClassifier) and not task_model.feature_based and task_model.features == "last":
        return task_model.encoder.eval(), task_model.head, []
    note = f"{task} head not exported, only the network it finetuned (transformers has no class for the head)"
    return load_encoder(src, cfg).eval(), None, [note]


def hf_tokenizer_files(tok, run_config: dict, model) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json that AutoTokenizer loads as a
    PreTrainedTokenizerFast. An encoder's tokenizer gets a template that adds [CLS]/[SEP] as plm's
    finetuning lays them out (plmcli.data.pairs), so HF pipelines feed the model what it saw."""
    from tokenizers import Tokenizer, processors

    from plmcli.data.pairs import encoder_frame
    from plmcli.models.base import uses_token_types

    tok_meta = run_config.get("tokenizer", {})
    ids = tok_meta.get("special_token_ids", {})
    roles = tok_meta.get("special_tokens") or {role: tok.id_to_token(i) for role, i in ids.items()}
    roles = {r: t for r, t in roles.items() if r in ids}
    tok = Tokenizer.from_str(tok.to_str())
    traits = type(model).traits
    causal = traits.causal
    types = not causal and uses_token_types(model)  # RoBERTa's 1: all type 0
    if not causal and "cls" in roles and "sep" in roles:
        c, s = roles["cls"], roles["sep"]
        single, pair = encoder_frame(traits.pair_layout or "cls_first", c, s).hf_template(1 if types else 0)
        template = processors.TemplateProcessing(single=single, pair=pair, special_tokens=[(c, ids["cls"]), (s, ids["sep"])])
        tok.post_processor = processors.Sequence([tok.post_processor, template]) if tok.post_processor else template
    names = {f"{role}_token": token for role, token in roles.items()}
    longest = model.max_positions  # every exportable family has a position bound (XLNet's: its config's)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **({"model_max_length": longest} if longest else {}),
              "clean_up_tokenization_spaces": False,
              "model_input_names": ["input_ids", *(["token_type_ids"] if types else []), "attention_mask"],
              **names}
    dump = lambda obj: json.dumps(obj, indent=2, ensure_ascii=False) + "\n"  # noqa: E731
    return {"tokenizer.json": tok.to_str(pretty=True), "tokenizer_config.json": dump(config),
            "special_tokens_map.json": dump(names)}


# ---------------------------------------------------------------- import


def import_hf(hf_dir: str, out: str, force: bool = False, origin: dict | None = None) -> dict:
    """Turn a local transformers directory into a plm run directory `out` (config.json, model.safetensors,
    tokenizer.json) that finetune, eval-ppl and generate read; `origin` is recorded in its imported_from
    (a Hub model's {"hub": {repo_id, revision, commit}}, plmcli.interop.hub). Returns a report naming the fresh
    heads: parts our model has that the checkpoint lacks, initialised (seed 0) instead.

    The run keeps the checkpoint's shapes (model.pad_vocab_multiple 1): padding rows would be weights the
    checkpoint never trained, and its config.json and state dict then convert back to transformers unchanged."""
    import torch
    from safetensors.torch import save_model

    from plmcli.config_sections import TokenizerConfig
    from plmcli.data.tokenizers import special_token_ids, tokenizer_hash, tokenizer_kind
    from plmcli.models.base import ExportsHFExtras
    from plmcli.models.registry import model_class

    src = Path(hf_dir)
    if not (src / "config.json").is_file():
        raise PlmError(f"{src} is not a transformers model directory (no config.json)",
                       "pass a local directory written by save_pretrained, or a Hub model id (e.g. bert-base-uncased)")
    hf = _read_json(src / "config.json")
    model_type = hf.get("model_type")
    families = hf_families()
    if model_type not in families:
        raise PlmError(f"{src}: model_type '{model_type}' has no plm family to import it",
                       f"supported model types: {', '.join(sorted(families))}")
    family = families[model_type]
    cls = model_class(family)
    weights = _read_weights(src)
    tok, roles = _read_tokenizer(src, hf)
    dest = _check_out(out, force, src)
    if issubclass(cls, ExportsHFExtras):  # the family's second networks, from the subdirectories export wrote
        extras = {d.name: (_read_json(d / "config.json"), _read_weights(d))
                  for d in sorted(src.iterdir()) if (d / "config.json").is_file()}
        cfg, state_dict = cls.from_hf(hf, weights, extras=extras)
    else:
        cfg, state_dict = cls.from_hf(hf, weights)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise PlmError(f"{src}: the tokenizer has {tok.get_vocab_size()} tokens but the model only {cfg.vocab_size}",
                       "pass the tokenizer files saved with this model")
    torch.manual_seed(0)  # fresh heads: the same on every import
    model = cls(cfg)
    fresh = _load_state(model, state_dict, src)
    ids = special_token_ids(tok, roles)
    entry = {**asdict(TokenizerConfig(special_tokens=roles)), "kind": tokenizer_kind(tok), "hash": tokenizer_hash(tok),
             "vocab_size": tok.get_vocab_size(), "special_tokens": roles, "special_token_ids": ids}
    objective = "clm" if cls.traits.causal else "mlm" if cls.traits.masked_lm else None
    run_config = {"family": family, "model": asdict(cfg), "objective": objective, "tokenizer": entry,
                  "imported_from": {"path": str(src.resolve()), "model_type": model_type,
                                    "architectures": hf.get("architectures"), **(origin or {})}}

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(run_config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        save_model(model, str(tmp / "model.safetensors"))
        tok.save(str(tmp / "tokenizer.json"))

    _replace_dir(dest, write)
    return {"out": str(dest), "family": family, "model_type": model_type, "architectures": hf.get("architectures"),
            "parameters": sum(p.numel() for p in model.parameters()), "vocab_size": tok.get_vocab_size(),
            "fresh": fresh}


def _load_state(model, state_dict: dict, src: Path) -> list[str]:
    """Load what the checkpoint has; return the modules with parameters it lacked (a tied weight counts as
    loaded: a bare BertModel's MLM decoder is fresh for its bias, its weight being the word embeddings)."""
    try:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
    except RuntimeError as e:
        raise PlmError(f"the weights in {src} do not fit its config.json ({str(e).splitlines()[-1].strip()})",
                       "pass the config.json saved with these weights") from e
    if unexpected:
        raise ValueError(f"{type(model).__name__}.from_hf returned keys the model does not have: {unexpected}")
    ours = model.state_dict()
    loaded = {ours[k].data_ptr() for k in state_dict}
    fresh = [k for k in missing if ours[k].data_ptr() not in loaded]
    # Heads may be fresh (a bare encoder has none); a model whose own layers are fresh would be a random one.
    params = {k for k, _ in model.named_parameters()}
    lost = [k for k in fresh if k in params]
    if params and len(lost) > len(params) / 2:
        raise PlmError(f"the weights in {src} are not a {type(model).__name__}'s: {len(lost)} of its {len(params)} "
                       f"parameters found no match (e.g. {lost[0]})", "pass the directory save_pretrained wrote for "
                       "this config.json, whose tensors carry its model_type's names")
    return list(dict.fromkeys(k.rsplit(".", 1)[0] for k in fresh))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PlmError(f"{path} is not valid JSON ({e})", "pass the file as save_pretrained wrote it") from e
    if not isinstance(data, dict):
        raise PlmError(f"{path} is not a JSON object", "pass the file as save_pretrained wrote it")
    return data


def _read_weights(src: Path) -> dict:
    """The checkpoint's tensors: model.safetensors (or its shards), else pytorch_model.bin (weights only)."""
    import torch
    from safetensors.torch import load_file as read_safetensors

    def load_file(path):
        try:
            return read_safetensors(path)
        except Exception as e:  # SafetensorError of a truncated or foreign file
            raise PlmError(f"{path} could not be read as safetensors ({str(e).splitlines()[0][:200]}): "
                           "truncated or damaged", "download or save the model again (save_pretrained)") from e

    def load_bin(path):
        try:
            return torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as e:
            raise PlmError(f"{path} could not be read as weights ({str(e).splitlines()[0]})",
                           "re-save the model with save_pretrained (safetensors)") from e

    state = None
    for name, load in (("model.safetensors", load_file), ("pytorch_model.bin", load_bin)):
        index = src / f"{name}.index.json"
        if (src / name).is_file():
            state = load(src / name)
        elif index.is_file():  # sharded: weight_map names each tensor's file
            state = {}
            for shard in sorted(set(_read_json(index).get("weight_map", {}).values())):
                state.update(load(src / shard))
        if state is not None:
            break
    if state is None:
        raise PlmError(f"{src} has no weights file",
                       "it needs model.safetensors (or pytorch_model.bin), as save_pretrained writes them")
    # TF-converted checkpoints name LayerNorm parameters gamma/beta; transformers renames them on load too.
    rename = {".gamma": ".weight", ".beta": ".bias"}
    return {next((k[:-len(a)] + b for a, b in rename.items() if k.endswith(a)), k): v for k, v in state.items()}


def _read_tokenizer(src: Path, hf: dict):
    """(tokenizers.Tokenizer that adds no special tokens, role -> token) from the directory's files."""
    from tokenizers import Tokenizer

    settings = _read_json(src / "tokenizer_config.json") if (src / "tokenizer_config.json").is_file() else {}
    named = {}
    for f in ("tokenizer_config.json", "special_tokens_map.json"):
        data = settings if f == "tokenizer_config.json" else (_read_json(src / f) if (src / f).is_file() else {})
        for role in _roles():
            value = data.get(f"{role}_token")
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str) and value:
                named.setdefault(role, value)
    if (src / "tokenizer.json").is_file():
        try:
            spec = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
            tok = Tokenizer.from_str(json.dumps(_without_inserted_specials(spec)))
        except Exception as e:
            raise PlmError(f"{src / 'tokenizer.json'} is not a valid tokenizer file ({str(e).splitlines()[0]})",
                           "pass the tokenizer.json saved with this model") from e
    elif (src / "vocab.txt").is_file():
        tok = _wordpiece(src / "vocab.txt", settings, named.get("unk", "[UNK]"))
    elif (src / "vocab.json").is_file() and (src / "merges.txt").is_file():
        tok = _bpe(src / "vocab.json", src / "merges.txt", settings, named.get("unk"))
    else:
        raise PlmError(f"{src} has no tokenizer files",
                       "it needs tokenizer.json, or vocab.txt (BERT WordPiece), "
                       "or vocab.json + merges.txt (GPT-2/RoBERTa BPE)")
    for role in _roles():  # roles no file names: the model config's ids (GPT-2: bos/eos 50256), else BERT's names
        token_id = hf.get(f"{role}_token_id")
        by_id = [tok.id_to_token(token_id)] if isinstance(token_id, int) else []
        known = [t for t in by_id + list(BERT_DEFAULT_SPECIALS.get(role, ())) if t and tok.token_to_id(t) is not None]
        if role not in named and known:
            named[role] = known[0]
    roles = {r: named[r] for r in _roles() if r in named and tok.token_to_id(named[r]) is not None}
    tok.add_special_tokens(list(dict.fromkeys(roles.values())))  # never split, whatever the pre-tokenizer
    return tok, roles


def _roles() -> tuple[str, ...]:
    from plmcli.data.tokenizers import ROLES

    return ROLES


def _without_inserted_specials(spec: dict) -> dict:
    """The tokenizer.json without post-processors that add special tokens (plm's objectives add them),
    a byte-level one kept for its offsets; no padding or truncation (batching pads)."""
    pp = spec.get("post_processor")
    items = (pp.get("processors") or []) if pp and pp.get("type") == "Sequence" else [pp] if pp else []
    keep = [p for p in items if p.get("type") not in SPECIAL_INSERTERS]
    if any(p.get("type") == "RobertaProcessing" and p.get("trim_offsets") for p in items) and \
            not any(p.get("type") == "ByteLevel" for p in keep):
        keep.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True})
    spec = {**spec, "padding": None, "truncation": None}
    spec["post_processor"] = None if not keep else keep[0] if len(keep) == 1 else {"type": "Sequence", "processors": keep}
    return spec


def _wordpiece(vocab_file: Path, settings: dict, unk: str):
    """BERT's WordPiece from vocab.txt, as transformers' BertTokenizerFast builds it."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {}
    for i, line in enumerate(vocab_file.read_text(encoding="utf-8").split("\n")):
        if line or i == 0:
            vocab.setdefault(line.rstrip("\r"), i)
    lower = settings.get("do_lower_case", True)
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
        strip_accents=settings.get("strip_accents"), lowercase=lower)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _bpe(vocab_file: Path, merges_file: Path, settings: dict, unk: str | None):
    """BPE from vocab.json + merges.txt: byte-level (GPT-2, RoBERTa) or, when pieces end in </w>, OpenAI GPT's."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in merges_file.read_text(encoding="utf-8").split("\n")
              if line.strip() and not line.startswith("#version")]
    if any(t.endswith("</w>") for t in vocab):
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, end_of_word_suffix="</w>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.BPEDecoder(suffix="</w>")
        return tok
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=settings.get("add_prefix_space", False))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tok


# ---------------------------------------------------------------- output directories


def _check_out(out: str, force: bool, source: Path) -> Path:
    """--out as a Path: a non-empty directory only with --force, and never the input or a folder holding it."""
    dest = Path(out)
    if dest.exists() and not dest.is_dir():
        raise PlmError(f"--out {dest} is a file", "pass a directory path")
    if dest.is_dir() and any(dest.iterdir()):
        if not force:
            raise PlmError(f"output directory {dest} already exists and is not empty",
                           "choose another --out, delete it, or add --force to replace it")
        inside = source.resolve()
        if dest.resolve() == inside or dest.resolve() in inside.parents:
            raise PlmError(f"--out {dest} holds the input {source}; --force would delete it", "choose another --out")
    return dest


def _replace_dir(dest: Path, write: Callable[[Path], None]) -> None:
    """Write into a temp dir beside `dest`, then rename it into place: `dest` is complete or unchanged."""
    from plmcli.data.store import atomic_dir

    with atomic_dir(dest) as tmp:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        for f in tmp.rglob("*"):  # safetensors writes its files 0600
            if f.is_file():
                f.chmod(0o666 & ~umask)
