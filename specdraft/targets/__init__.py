"""The frozen target: loading (hub id, directory, GGUF, packaged file) and feature capture."""
from specdraft.targets.features import capture_features
from specdraft.targets.load import (
                                   LoadedTarget,
                                   load_target,
                                   load_target_info,
                                   load_tokenizer,
                                   resolve_dtype,
                                   target_provenance,
)

__all__ = ["LoadedTarget", "capture_features", "load_target", "load_target_info", "load_tokenizer", "resolve_dtype",
           "target_provenance"]
