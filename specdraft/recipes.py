"""Recipes: OmegaConf YAML -> the plain dataclasses of `specdraft.config`, in two phases.

Phase 1 reads `method.name` and picks that method's config dataclass from the registry; phase 2 merges the
whole recipe (YAML + `key=value` overrides) into a structured schema, so that an unknown key or a wrong type
is an error naming the key and the valid ones. After loading, code sees only dataclasses. `check_recipe` makes
the same checks of every section but `method` without importing the method registry (nor torch), so that the CLI
refuses a bad key or value before a stage's heavy imports.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import List

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from specdraft.config import RENAMED_KEYS, SECTIONS, Recipe, field_choices
from specdraft.core.errors import SpecdraftError, choices_error, error_summary, shown
from specdraft.core.io import write_text


def _valid_keys(section: str, method_config) -> List[str]:
    cls = method_config if section == "method" else SECTIONS.get(section)
    if cls is None:
        return list(SECTIONS)
    names = [f.name for f in dataclasses.fields(cls)]
    return ["name", *names] if section == "method" else names


def _yaml_problem(err) -> str:
    """A YAML error on one line: its problem and where (PyYAML writes context, problem and marks on several)."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(err, 'problem', None) or error_summary(err)}{where}"


def _read_yaml(path: Path):
    """The recipe file as an OmegaConf mapping; a YAML syntax error, an alias bomb (OmegaConf caps the nodes that
    aliases expand to), bad bytes or anything but a mapping is one line naming the file."""
    if not path.is_file():
        raise SpecdraftError(f"recipe file not found: {path}")
    try:
        raw = OmegaConf.load(path)
    except yaml.YAMLError as err:
        raise SpecdraftError(f"cannot parse recipe {path}: {_yaml_problem(err)}") from None
    except (OSError, ValueError, OmegaConfBaseException) as err:
        raise SpecdraftError(f"cannot read recipe {path}: {error_summary(err)}") from None
    if not isinstance(raw, DictConfig):
        raise SpecdraftError(f"recipe {path} holds a {type(raw).__name__}; expected a mapping of sections "
                             f"({', '.join(SECTIONS)})")
    return raw


def _renamed(raw):
    """An older recipe's keys under their names now (RENAMED_KEYS), where the recipe does not give both."""
    for old, new in RENAMED_KEYS.items():
        (section, old_key), new_key = old.split("."), new.split(".")[1]
        values = raw.get(section)
        if isinstance(values, DictConfig) and old_key in values and new_key not in values:
            values[new_key] = values.pop(old_key)
    return raw


def _renamed_override(override: str) -> str:
    """A `key=value` override of an older key under the key's name now (RENAMED_KEYS)."""
    key, _, value = override.partition("=")
    return f"{RENAMED_KEYS[key]}={value}" if key in RENAMED_KEYS else override


def _raw_recipe(path: str | Path, overrides: List[str]):
    path = Path(path)
    raw = _renamed(_read_yaml(path))
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise SpecdraftError(f"override {bad[0]!r} is not of the form key=value")
    overrides = [_renamed_override(override) for override in overrides]
    try:
        return OmegaConf.merge(raw, OmegaConf.from_dotlist(list(overrides)))
    except (yaml.YAMLError, OmegaConfBaseException) as err:
        raise SpecdraftError(f"cannot parse recipe {path} with overrides: {error_summary(err)}") from None


def check_recipe(path: str | Path, overrides: List[str] = ()) -> None:
    """`load_recipe`'s checks of the file, the overrides and every section but `method` (whose dataclass is its
    method's, in modules that import torch): a problem is the same SpecdraftError, raised without the method
    registry, torch or the target loader imported."""
    raw = _sections(path, list(overrides))
    raw.method = {}
    _validated(OmegaConf.structured(Recipe(method={})), raw, path, None)


def _sections(path: str | Path, overrides: List[str]):
    """The recipe with its overrides, checked to hold known sections and a method.name."""
    raw = _raw_recipe(path, overrides)
    unknown = [k for k in raw.keys() if k not in SECTIONS]
    if unknown:
        raise SpecdraftError(f"unknown recipe section {shown(unknown[0])}; valid: {', '.join(SECTIONS)} (in {path})")
    method_raw = raw.get("method") or {}
    if not isinstance(method_raw, (DictConfig, dict)):
        raise SpecdraftError(f"recipe section 'method' in {path} is a {type(method_raw).__name__}; expected a "
                             f"mapping with method.name")
    if "name" not in method_raw:
        raise SpecdraftError("recipe has no method.name")
    return raw


def load_recipe(path: str | Path, overrides: List[str] = (), trust_remote_code: bool = False) -> Recipe:
    """Load and validate a recipe; every problem is a SpecdraftError naming the key and the valid ones.
    `trust_remote_code`: the command line's consent to run the target's own code; the recipe's own
    `target.trust_remote_code` never turns it on (specdraft.targets.remote_code)."""
    from specdraft.methods import get_method  # here: `check_recipe` runs without the registry (and torch)
    from specdraft.targets.remote_code import with_remote_code

    raw = _sections(path, list(overrides))
    method_raw = raw.method
    spec = get_method(str(method_raw["name"]))  # phase 1: pick the schema
    raw.method = {k: v for k, v in OmegaConf.to_container(method_raw).items() if k != "name"}
    schema = OmegaConf.structured(Recipe(method=spec.config(), method_name=spec.name))
    recipe = _validated(schema, raw, path, spec.config)  # phase 2: the method's dataclass and the fixed sections
    recipe.target = with_remote_code(recipe.target, trust_remote_code, f"recipe {path}")
    return recipe


def _validated(schema, raw, path, method_config) -> Recipe:
    """`raw` merged into `schema` and built: an unknown key, a wrong type or a refused value is one line."""
    try:
        merged = OmegaConf.merge(schema, raw)
        recipe = OmegaConf.to_object(merged)
    except ConfigKeyError as err:
        raise _key_error(err, method_config, path) from None
    except ValidationError as err:
        raise _value_error(err, path, method_config) from None
    except (TypeError, ValueError, OmegaConfBaseException) as err:
        raise SpecdraftError(f"invalid recipe {path}: {error_summary(err)}") from None
    return recipe


def _nested_section(full_key: str):
    """(name, dataclass) of the nested section a key lies in (distill.server), or None."""
    parts = full_key.split(".")
    cls = SECTIONS.get(parts[0])
    found = [f.default_factory for f in dataclasses.fields(cls) if f.name == parts[1]] if cls and len(parts) > 2 else []
    return (f"{parts[0]}.{parts[1]}", found[0]) if found and dataclasses.is_dataclass(found[0]) else None


def _key_error(err: ConfigKeyError, method_config, path: Path) -> SpecdraftError:
    full_key = getattr(err, "full_key", None) or str(err).split("'")[1]
    section = full_key.split(".")[0]
    valid = _valid_keys(section, method_config)
    nested = _nested_section(full_key)
    if nested is not None:
        section, valid = nested[0], [f.name for f in dataclasses.fields(nested[1])]
    return SpecdraftError(f"unknown recipe key {shown(full_key)}; valid keys in {section!r}: {', '.join(valid)} "
                          f"(in {path})")


def _value_error(err: ValidationError, path: Path, method_config) -> SpecdraftError:
    """A value of the wrong type, named by its key and the type its field declares; the value itself only as
    `shown` shows it (OmegaConf's message quotes it whole)."""
    key = getattr(err, "full_key", None)
    if not key:
        return SpecdraftError(f"recipe {path}: a section is not a mapping of keys (sections: {', '.join(SECTIONS)})")
    section, _, name = key.partition(".")
    choices = field_choices(SECTIONS[section]).get(name) if SECTIONS.get(section) is not None else None
    if choices is not None:  # a field of choices (a Literal), worded as config.check_choices words it
        return choices_error(key, getattr(err, "value", None), choices)
    cls = method_config if section == "method" else SECTIONS.get(section)
    hints = typing.get_type_hints(cls) if cls is not None else {}
    expected = hints.get(name.split(".")[0])
    expected = expected.__name__ if isinstance(expected, type) else str(expected or "another type").replace(
        "typing.", "")
    return SpecdraftError(f"bad value for {key} in {path}: expected {expected}, got {shown(err.value)}")


def recipe_to_yaml(recipe: Recipe) -> str:
    """The resolved recipe, as saved beside checkpoints and exports (loadable by load_recipe)."""
    data = dataclasses.asdict(recipe)
    data["method"] = {"name": data.pop("method_name"), **data["method"]}
    return OmegaConf.to_yaml(OmegaConf.create(data))


def save_recipe(recipe: Recipe, directory: str | Path) -> Path:
    """Write recipe.yaml atomically (several workers of one job may write it at once)."""
    out = Path(directory) / "recipe.yaml"
    write_text(out, recipe_to_yaml(recipe))
    return out
