"""C2T's export (`hf`: the classifier's weights beside a copy of its draft in `draft/`), its reading back, and the
runtime drafter: the base draft's own, extended with the classifier's tree scorer."""
from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, Dict, List, Tuple

import torch

from specdraft.core.drafting import ExtendedDrafter
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.methods.c2t.config import C2TConfig
from specdraft.methods.c2t.model import C2TClassifier, ClassifierScorer

FEATURES = {"paper": ("joint_probability", "parent_entropy_top1000", "depth"),
            "extended": ("joint_probability", "parent_entropy_top1000", "depth", "probability",
                         "parent_joint_probability", "rank")}  # the classifier's input, in order


def c2t_to_hf(classifier: C2TClassifier, cfg: C2TConfig, target: TargetInfo, provenance: Dict[str, Any]):
    config = {"architectures": ["C2TTreeClassifier"], "model_type": "c2t", "features": list(FEATURES[cfg.features]),
              "hidden_size": classifier.hidden.out_features,
              "specdraft": {"method": "c2t", "method_config": asdict(cfg), **provenance}}
    return config, {name: tensor.detach() for name, tensor in classifier.state_dict().items()}


def c2t_hf_keys(classifier: C2TClassifier, target: TargetInfo) -> List[str]:
    return ["hidden.weight", "hidden.bias", "out.weight", "out.bias", "feature_scale"]


def c2t_from_export(config: Dict[str, Any], tensors: Dict[str, torch.Tensor],
                    ctx: DraftContext) -> Tuple[C2TConfig, C2TClassifier]:
    known = {f.name for f in fields(C2TConfig)}
    cfg = C2TConfig(**{k: v for k, v in config["specdraft"]["method_config"].items() if k in known})
    if ctx.base is None:
        raise SpecdraftError(f"this C2T export carries no draft to prune (no draft/ named in its config.json; it "
                             f"was trained over {cfg.draft}); export its run again with `specdraft export`")
    if "feature_scale" not in tensors:
        raise SpecdraftError(f"this C2T export's classifier (over {cfg.draft}) reads unscaled features, which this "
                             f"runtime no longer scores: train and export it again")
    classifier = C2TClassifier(cfg, ctx)
    classifier.load_state_dict(tensors)
    return cfg, classifier


def c2t_runtime(classifier: C2TClassifier, cfg: C2TConfig, target_model) -> ExtendedDrafter:
    """The base draft's runtime drafter, its trees scored by the classifier (its β: method.threshold)."""
    if classifier.base is None:
        raise SpecdraftError(f"a C2T classifier serves beside the draft it was trained for; none was loaded "
                             f"(method.draft {cfg.draft})")
    scorer = ClassifierScorer(classifier, cfg, target_model.device)
    return ExtendedDrafter(classifier.base.runtime(target_model), scorer=scorer)


def c2t_feature_layers(cfg: C2TConfig, target: TargetInfo) -> List[int]:
    """The classifier reads no target feature (its base draft reads its own)."""
    return []
