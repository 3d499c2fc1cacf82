"""The runtime's command-line flags (`specdraft generate`, `specdraft bench`), derived from `RuntimeConfig`: one flag
per field, named after it (`--field-name`; a bool that is on by default: `--no-field-name`), typed by its annotation
(int, float or str; a Literal's values as its choices; a list: one value or more), its docstring as the help. Every
flag defaults to None, so a flag left out keeps the draft's own setting (its export's or its recipe's `runtime:`
section); `runtime_config` lays the given ones over it. No torch here: the CLI builds its parser from this module.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import typing
from typing import Dict, List, Mapping, Optional, Tuple

from specdraft.config import RuntimeConfig, field_choices
from specdraft.core.errors import SpecdraftError
from specdraft.decoding.shapes import shape_defaults


@functools.lru_cache(maxsize=None)
def field_docs(cls) -> Dict[str, str]:
    """{field name: its docstring, whitespace collapsed} of a dataclass and its bases (the string literal that follows
    each annotation in a class body)."""
    docs: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for node, following in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr) \
                    and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _unwrapped(annotation) -> Tuple[object, bool]:
    """An annotation -> (its type without Optional, whether it is a List)."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is typing.Union and len(args) == 1:
        return _unwrapped(args[0])
    if typing.get_origin(annotation) in (list, List):
        return args[0], True
    return annotation, False


def value_type(field_type) -> type:
    """The type a flag's (or a `FIELD=VALUE` override's) text parses to for a field of `field_type`: bool, int,
    float or str (a Literal's values are str)."""
    kind, _ = _unwrapped(field_type)
    return kind if kind in (bool, int, float) else str


@functools.lru_cache(maxsize=None)
def field_types() -> Dict[str, object]:
    """{RuntimeConfig field: its resolved annotation}."""
    return typing.get_type_hints(RuntimeConfig)


def _help(name: str, doc: str, default, flips: bool) -> str:
    """A field's docstring as a flag's help: what turning it off does for a `--no-` flag, the default for the rest,
    the default shapes (decoding/shapes.py) for the depth, where the shape's docstrings point."""
    text = doc
    if name == "depth":
        text += f" ({shape_defaults()})"
    if flips:
        text = f"on by default; this flag turns it off. {text}"
    elif default is not None and default is not False and default != []:
        text += f" (default: {default})"
    return text.replace("%", "%%")


def add_runtime_flags(parser, sweeps: Mapping[str, Tuple[str, str]] = {}) -> None:
    """Every RuntimeConfig field as a flag of `parser`. `sweeps`: {field: (dest, help)}, fields that take several
    values, each run apart (bench's --judge-threshold), gathered under `dest`; the field itself reads None."""
    docs, types = field_docs(RuntimeConfig), field_types()
    for item in dataclasses.fields(RuntimeConfig):
        name, annotation = item.name, types[item.name]
        default = item.default if item.default is not dataclasses.MISSING else item.default_factory()
        flag, kind, (_, is_list) = "--" + name.replace("_", "-"), value_type(annotation), _unwrapped(annotation)
        if name in sweeps:
            dest, extra = sweeps[name]
            parser.add_argument(flag, type=kind, nargs="+", default=None, dest=dest,
                                help=_help(name, f"{docs[name]} {extra}", None, False))
            parser.set_defaults(**{name: None})
        elif kind is bool:
            flips = default is True
            parser.add_argument(f"--no-{name.replace('_', '-')}" if flips else flag, dest=name, default=None,
                                action="store_false" if flips else "store_true", help=_help(name, docs[name], default,
                                                                                               flips))
        else:
            parser.add_argument(flag, type=kind, default=None, nargs="+" if is_list else None,
                                choices=field_choices(RuntimeConfig).get(name),
                                help=_help(name, docs[name], default, False))


def given_settings(args) -> Dict[str, object]:
    """The runtime settings the command line gave (the flags not left out), by field name."""
    names = [item.name for item in dataclasses.fields(RuntimeConfig)]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def runtime_config(base: RuntimeConfig, args, dtype: Optional[str] = None) -> RuntimeConfig:
    """`base` (the draft's own settings) with every flag given on the command line over it (`dtype` over all)."""
    given = given_settings(args)
    if dtype is not None:
        given["dtype"] = dtype
    try:
        return dataclasses.replace(base, **given)
    except TypeError as err:
        raise SpecdraftError(f"bad runtime setting: {err}") from None
