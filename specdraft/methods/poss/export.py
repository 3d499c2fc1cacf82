"""PosS's `hf` layout (EAGLE-3's config keys plus `poss_config`; weights `specialists.{j}.*` laid out as EAGLE-3's
`midlayer.*`) and its warm start from an EAGLE-3 run or export (`method.init_from`)."""
from __future__ import annotations

from typing import Any, Dict, List

from specdraft.core.types import DraftContext, TargetInfo
from specdraft.methods.eagle3 import check_source, eagle3_hf_config, eagle3_hf_keys, load_initial_state
from specdraft.methods.poss.config import PossConfig
from specdraft.methods.poss.model import PossDraft


def specialist_by_depth(draft: PossDraft, depths: int) -> List[int]:
    """[specialist serving draft depth d] for d = 1..depths (depth d is TTT step d - 1)."""
    return [draft.specialist_for(depth - 1) for depth in range(1, depths + 1)]


def poss_to_hf(draft: PossDraft, cfg: PossConfig, target: TargetInfo, provenance: Dict[str, Any]):
    config = eagle3_hf_config(draft, cfg, target, provenance)
    config["architectures"] = ["PossEagle3Draft"]  # no serving engine claims it: ours alone loads it
    config["num_hidden_layers"] = len(draft.specialists)
    config["specdraft"]["method"] = "poss"
    config["poss_config"] = {
        "num_specialists": len(draft.specialists),
        "positions_per_specialist": draft.positions_per_specialist,
        "specialist_by_depth": specialist_by_depth(draft, cfg.ttt_steps),
        "deeper": "the last specialist serves every depth past this list",
        "layer_weights": "specialists.{j}.* laid out as EAGLE-3's midlayer.*",
    }
    tensors = {name: tensor.detach() for name, tensor in draft.state_dict().items()}
    return config, tensors


def poss_hf_keys(draft: PossDraft, target: TargetInfo) -> List[str]:
    shared = [k for k in eagle3_hf_keys(draft, target) if not k.startswith("midlayer.")]
    layer_keys = [k[len("midlayer."):] for k in eagle3_hf_keys(draft, target) if k.startswith("midlayer.")]
    return shared + [f"specialists.{j}.{k}" for j in range(len(draft.specialists)) for k in layer_keys]


def poss_initialize(draft: PossDraft, cfg: PossConfig, ctx: DraftContext) -> None:
    """`method.init_from` (ctx.warm_start): shared parts and every specialist from an EAGLE-3 run or export."""
    source = check_source(ctx.warm_start, cfg, draft.feature_layers, "PosS head")
    state = {}
    for name, tensor in source.state_dict().items():
        if name.startswith("midlayer."):
            state.update({f"specialists.{j}.{name[len('midlayer.'):]}": tensor for j in range(len(draft.specialists))})
        else:
            state[name] = tensor
    load_initial_state(draft, state, cfg, "PosS head")
