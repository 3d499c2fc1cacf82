"""Where a target comes from, as a serving engine names it: the hub id of a target given by hub id, or the one a
GGUF file's metadata records of the model it was converted from. A local directory (or a GGUF without such
metadata) names none; an export that must name its verifier (vLLM's speculators layout) then takes `--verifier`."""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import List, Optional

from specdraft.core.errors import SpecdraftError
from specdraft.core.io import package_file
from specdraft.core.types import TargetInfo

log = logging.getLogger(__name__)

GGUF_SOURCE_KEYS = ("general.source.huggingface.repository", "general.source.repo_url", "general.repo_url",
                    "general.source.url", "general.url")
"""GGUF metadata that may name the model a file was converted from (llama.cpp's converters write the first on
older files, the repo URLs on newer ones), in the order they are read."""
HUB_URL = re.compile(r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/([\w.-]+/[\w.-]+?)(?:\.git)?/?$")
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def as_hub_id(value: str) -> Optional[str]:
    """A repo id (ORG/NAME) or a Hugging Face URL of one -> ORG/NAME; anything else -> None."""
    value = value.strip()
    match = HUB_URL.match(value)
    if match:
        return match.group(1)
    return value if HUB_ID.match(value) and "://" not in value else None


def gguf_source(path: Path) -> Optional[str]:
    """The hub id a GGUF file's metadata names as its source (GGUF_SOURCE_KEYS), or None (none recorded, or the
    file unreadable: the target loader reports a corrupt file, not this lookup)."""
    try:
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields
        for key in GGUF_SOURCE_KEYS:
            if key in fields:
                found = as_hub_id(str(fields[key].contents()))
                if found:
                    return found
    except Exception as err:  # noqa: BLE001 (any reader failure: no hub id, said once)
        log.warning("cannot read the metadata of %s (%s): no hub id from it", path, type(err).__name__)
    return None


def target_hub_id(target_path: str) -> Optional[str]:
    """The hub id of the target at `target_path` (TargetConfig.path): itself when it is one (no such local
    directory), the source a GGUF names (`.gguf` or pkg:PACKAGE/FILE.gguf), else None."""
    if target_path.endswith(".gguf"):
        try:
            gguf = package_file(target_path) if target_path.startswith("pkg:") else Path(target_path).expanduser()
        except SpecdraftError:
            return None
        return gguf_source(gguf) if gguf.is_file() else None
    if target_path.startswith("pkg:") or Path(target_path).expanduser().exists():
        return None
    return as_hub_id(target_path)


def hf_architectures(target: TargetInfo) -> List[str]:
    """The Hugging Face classes of the target as its config.json names them (`architectures`, e.g.
    ["Qwen3MoeForCausalLM"]), what speculators' `verifier.architectures` records. A config that names none (or an
    export written before TargetInfo kept them) gets the causal-LM class transformers maps its model_type to, e.g.
    gemma3_text -> Gemma3ForCausalLM; [] where it maps none."""
    if target.architectures:
        return list(target.architectures)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(target.model_type)
    return [mapped] if mapped else []
