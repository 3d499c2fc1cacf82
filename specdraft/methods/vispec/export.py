"""ViSpec's on-disk layout (`hf`): EAGLE-3's SGLang-style config and weights, plus the image adaptor and img_fc.
No serving engine loads ViSpec drafts; specdraft's runtime does (its config names the architecture
`VispecEagle3Draft`). A warm start (`method.init_from`) takes every EAGLE-3 weight from an EAGLE-3 run or export."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.methods.eagle3 import check_source, eagle3_hf_config, eagle3_hf_keys
from specdraft.methods.vispec.config import VispecConfig
from specdraft.methods.vispec.model import VispecDraft

ARCHITECTURE = "VispecEagle3Draft"


def vispec_to_hf(draft: VispecDraft, cfg: VispecConfig, target: TargetInfo, provenance: Dict[str, Any]):
    config = eagle3_hf_config(draft, cfg, target, provenance)
    config["architectures"] = [ARCHITECTURE]
    config["vispec_config"] = {"num_queries": draft.num_queries, "image_adaptor_heads": draft.image_adaptor.heads}
    config["specdraft"] = {**config["specdraft"], "method": "vispec", "method_config": asdict(cfg)}
    return config, {name: tensor.detach() for name, tensor in draft.state_dict().items()}


def vispec_hf_keys(draft: VispecDraft, target: TargetInfo) -> List[str]:
    adaptor = [f"image_adaptor.{name}" for name in ("queries", "norm.weight", "k_proj.weight", "v_proj.weight",
                                                      "o_proj.weight")]
    return [*eagle3_hf_keys(draft, target), *adaptor, "img_fc.weight"]


def vispec_initialize(draft: VispecDraft, cfg: VispecConfig, ctx: DraftContext) -> None:
    """`method.init_from`: every EAGLE-3 weight from an EAGLE-3 run or export (the adaptor and img_fc as built)."""
    source = check_source(ctx.warm_start, cfg, draft.feature_layers, "ViSpec draft")
    missing, unexpected = draft.load_state_dict(source.state_dict(), strict=False)
    own = [name for name in missing if not name.startswith(("image_adaptor.", "img_fc."))]
    if own or unexpected:
        raise SpecdraftError(f"method.init_from {cfg.init_from} does not fit this ViSpec draft: missing "
                             f"{own[:3]}, unexpected {unexpected[:3]}")
