"""A small vision-language model to measure on, built here (no VLM can be downloaded): `specdraft build-small-vlm`
(build.py) trains a vision tower, projector and LoRA on SmolLM2 over drawn scenes (scenes.py) described briefly or
at length (long.py) or read out item by item (determined.py), and writes held-out prompt sets beside it with the
model's accuracy on them (prompts.py).
recipes/vispec_smallvlm.yaml and tools/bench/vispec.py run on what it writes.

Heavy imports stay inside the submodules, so `import specdraft.vlm` is cheap.
"""
