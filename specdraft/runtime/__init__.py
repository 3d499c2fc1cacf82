"""The lightweight runtime: an export (or a run) and its target loaded into the decoding engine (load.py), and
`specdraft bench` (bench.py, profile.py). It needs torch, safetensors, transformers and a tokenizer, nothing of the
trainer (lightning, deepspeed, datasets, omegaconf, peft, bitsandbytes)."""
