"""How a recipe section is declared and checked: the constraint types a field's annotation carries (`Range`,
`Divides`, `Rule`, `OrAuto`, `Folded`, `Formerly`, `Axis`, and the usual aliases such as `Size` and `Probability`),
and the machinery that builds a section from raw YAML values (`build_section`: unknown keys, older keys, coercion,
range and rule checks, each a one-line PlmError) and reads its fields' docstrings (`field_docs`).

The sections themselves live in config_sections.py (tokenizer, data, finetuning's task/model/lora/grid) and config.py
(model, objective, train, optim); models declare their own with these types.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Union

import yaml

from plmcli.errors import PlmError


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


@dataclass(frozen=True)
class Formerly:
    """An older key of this field, still read where a section is built (build_section): the old key's value,
    mapped by `values`, sets the field (a value mapped to None leaves the field as it is). Given beside the field,
    the field's default counts as unset — a saved config.json writes every field out —, and any other value
    than the mapped one is refused as a contradiction. e.g. objective.cross_documents false is packing
    doc_sentences: `Annotated[..., Formerly("cross_documents", {False: "doc_sentences", True: None})]`."""

    key: str
    values: dict


@dataclass(frozen=True)
class Axis:
    """A grid's list of values for the field `key` (grid.lr tries values of optim.lr): the flag of `key` also
    takes a comma list, which sets this field instead (`plm finetune --lr 5e-5,3e-5`)."""

    key: str


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

# ---------------------------------------------------------------- building and checking a section


def reject_unknown(raw: dict, allowed, where: str) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(allowed)}"
            raise PlmError(f"unknown key '{key}' in {where}", hint)


def yaml_scalar(v) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...").strip()


KEY_ALIASES = {"train": {"batch_size": "global_batch_size"}}
"""Other names of a section's keys: finetuning's `train.batch_size` is the train section's global_batch_size."""


def canonical(raw: dict) -> dict:
    """`raw` (sections of keys) with every key under its field's name (KEY_ALIASES); both names at once are refused."""
    out = dict(raw)
    for section, aliases in KEY_ALIASES.items():
        part = out.get(section)
        if not isinstance(part, dict):
            continue
        part = dict(part)
        for alias, name in aliases.items():
            if alias in part:
                if name in part:
                    raise PlmError(f"{section}.{alias} and {section}.{name} name one setting", "keep one of them")
                part[name] = part.pop(alias)
        out[section] = part
    return out


def former_keys(fields: dict, hints: dict, raw: dict, where: str) -> dict:
    """`raw` with each older key a field's type declares (Formerly) read as that field: the other name of a key
    that also changed its values, where KEY_ALIASES renames a key alone."""
    out = dict(raw)
    for name, tp in hints.items():
        for old in _formerly(tp):
            if old.key not in out:
                continue
            v = out.pop(old.key)
            known = [k for k in old.values if type(k) is type(v) and k == v]  # true is not 1; a list is no key
            if not known:
                choices = " or ".join(yaml_scalar(k) for k in old.values)
                raise PlmError(f"{where}.{old.key} {v!r} is not {choices}", f"set {where}.{name} instead")
            new = old.values[known[0]]
            if new is None:
                continue
            given = out.get(name, new)
            if given not in (new, _default(fields[name])):
                raise PlmError(f"{where}.{old.key} {yaml_scalar(v)} (the older name of {where}.{name} {new}) contradicts "
                               f"{where}.{name} {given}", f"drop {where}.{old.key}, and keep {where}.{name}={given} "
                               f"or set {where}.{name}={new}")
            out[name] = new
    return out


def _formerly(tp) -> list:
    """The Formerly declarations of a field's type (Annotated metadata)."""
    if typing.get_origin(tp) is not Annotated:
        return []
    return [m for m in tp.__metadata__ if isinstance(m, Formerly)]


def build_section(cls, raw: dict, where: str):
    if not isinstance(raw, dict):
        raise PlmError(f"section '{where}' must be a mapping", f"write {where}: followed by key: value lines")
    raw = canonical({where: raw})[where]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls, include_extras=True)
    raw = former_keys(fields, hints, raw, where)
    reject_unknown(raw, list(fields), where)
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in raw.items()}
    _check_values(fields, hints, kwargs, where)
    return cls(**kwargs)


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _check_values(fields: dict, hints: dict, kwargs: dict, where: str) -> None:
    """Every field against what its type declares (Literal, Range, Divides, Rule), defaults
    included, so a recipe fails at load and never hours into a run. Cross-field checks come last: they
    read fields that must already be valid."""
    values = {k: kwargs[k] if k in kwargs else _default(f) for k, f in fields.items()}
    checks = [(k, c) for k in fields for c in _constraints(hints[k])]
    for k, c in sorted(checks, key=lambda kc: isinstance(kc[1], (Divides, Rule))):
        v = values[k]
        if v is None or c.holds(v, values):
            continue
        default = _default(fields[k])
        key = f"{where}.{k}"
        if isinstance(c, Rule):
            hint = c.hint or (f"e.g. --set {key}={yaml_scalar(default)}" if c.holds(default, values) else f"change {key}")
            raise PlmError(f"{key} {v} {c.says.format(where=where, **values)}", hint.format(where=where, **values))
        if isinstance(c, tuple):  # the choices of a Literal
            raise PlmError(f"{key} {v!r} is not one of {', '.join(map(str, c.choices))}", f"e.g. --set {key}={c.choices[0]}")
        if isinstance(c, Divides):
            total = values[c.other]
            fit = max(n for n in range(1, min(v, total) + 1) if total % n == 0)
            raise PlmError(f"{where}.{c.other} {total} is not divisible by {key} {v}",
                           f"pick {k} dividing {c.other}, e.g. --set {key}={fit}")
        raise PlmError(f"{key} {v} must be {c}", f"e.g. --set {key}={_example(c, default, values)}")


def check_value(cls, name: str, value, label: str) -> None:
    """One field's `value` against what its type declares (its own checks: the cross-field rules need the whole
    section), the error naming `label` as the user typed it (a flag: `--epochs 0 is out of range: must be ≥ 1`).
    A flag and its config key are one declaration: the field."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    tp = typing.get_type_hints(cls, include_extras=True)[name]
    v = _coerce(value, tp, label)
    for c in _constraints(tp):
        if v is None or isinstance(c, (Divides, Rule)) or c.holds(v, {}):
            continue
        default = _default(f)
        if isinstance(c, _Choices):
            raise PlmError(f"{label} {value!r} is not one of {', '.join(map(str, c.choices))}",
                           f"use {label} {default if default in c.choices else c.choices[0]}")
        raise PlmError(f"{label} {value} is out of range: must be {c}",  # as typed: -1, not the float -1.0
                       f"e.g. {label} {yaml_scalar(_example(c, default, {}))}" + (", or leave it out" if default is None else ""))



def check_option(flag: str, value, allowed: Range, hint: str) -> None:
    """A command's numeric option that is no recipe field (--stop-after, --vocab-size, --limit) against `allowed`:
    one PlmError naming the flag, checked before anything is read. None is "not given" and passes; 0 is a value."""
    if value is not None and not allowed.holds(value, {}):
        raise PlmError(f"{flag} {value:g} must be {allowed}", hint)

def _example(c, default, values: dict):
    """A value for a hint: the field's default where it meets the check `c`, else one inside its Range."""
    return default if default is not None and c.holds(default, values) else _inside(c)


def _inside(r) -> float:
    """A value within the Range `r`, for a hint when the field's default is not one (None)."""
    if not r.lo_open:
        return r.lo
    return (r.lo + r.hi) / 2 if r.hi is not None else r.lo + 1


class _Choices(tuple):
    """A Literal's values as a check: the value must be one of them."""

    @property
    def choices(self):
        return tuple(self)

    def holds(self, v, values: dict) -> bool:
        return v in self


def _constraints(tp) -> list:
    """The checks a field's type declares: Annotated metadata and Literal choices, through Optional."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [c for a in typing.get_args(tp) if a is not type(None) for c in _constraints(a)]
    if origin is Annotated:
        return [*_constraints(tp.__origin__), *(m for m in tp.__metadata__ if hasattr(m, "holds"))]
    if origin is Literal:
        return [_Choices(typing.get_args(tp))]
    return []


def plain_type(tp):
    """(the Python type a field's value has — bool, int, float, str or list —, its choices for a Literal, else
    None, its Axis when a grid's list is one): what a command-line flag of the field takes."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return plain_type(next(a for a in typing.get_args(tp) if a is not type(None)))
    if origin is Annotated:
        base, choices, axis = plain_type(tp.__origin__)
        return base, choices, next((m for m in tp.__metadata__ if isinstance(m, Axis)), axis)
    if origin is Literal:
        choices = typing.get_args(tp)
        return type(choices[0]), choices, None
    return (list if origin is list else tp), None, None


def _coerce(value, tp, where: str):
    origin = typing.get_origin(tp)
    if origin is Annotated:  # the constraints are checked once every field is built
        if any(isinstance(m, Folded) for m in tp.__metadata__) and isinstance(value, str):
            folded = value.strip().lower()
            value = folded if folded in typing.get_args(tp.__origin__) else value  # else the error shows it as written
        return _coerce(value, tp.__origin__, where)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and str(value).lower() not in choices:  # YAML 1.1 reads no / off / yes as booleans
            value = next((c for c in choices if c in (("yes", "on", "true") if value else ("no", "off", "false"))), value)
        return _coerce(value, type(choices[0]), where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        refused = []
        for arm in args:  # the first type that takes the value (a count, else the word auto)
            try:
                return _coerce(value, arm, where)
            except PlmError as e:
                refused.append(e)
        raise refused[0]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(where, value, "true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _type_error(where, value, "an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise _type_error(where, value, "a number")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise _type_error(where, value, "a string")
    if tp is list or origin is list:
        item = typing.get_args(tp)  # list[float]: each item coerced as a float field is; a lone value, a list of one
        if item:
            if isinstance(value, str):  # `--set train.report_to=tensorboard,mlflow`: a comma string is its items
                value = [v.strip() for v in value.split(",") if v.strip()]
            items = value if isinstance(value, (list, tuple)) else [value]
            return [_coerce(v, item[0], where) for v in items]
        if isinstance(value, (list, tuple)):
            return list(value)
        raise _type_error(where, value, "a list, e.g. [0.9, 0.999]")
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise _type_error(where, value, "a mapping")
    return value


def _type_error(where, value, want) -> PlmError:
    return PlmError(f"{where} = {value!r} is not {want}", f"e.g. --set {where}=<{want.split(',')[0]}>")


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a config dataclass (the string literal after each field), its bases' included:
    the help of the field's flag, and the reference in `plm recipes show --help`."""
    import ast
    import inspect
    import textwrap

    docs = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
                docs[a.target.id] = str(b.value.value)
    return docs
