"""Speculative decoding on the device, batch 1, knowing no method. `engine.py`: `SpecEngine`, the loop that picks a
kind of cycle and runs it; `cycles/`: the cycle kinds and the interface a kind implements (cycles/base.py), with
what every kind shares (cycles/context.py); `policies/`: the drafting policies, one module per `--policy` name;
`verifier/`: the target as the runtime runs it (a compact static-cache decoder); `tree.py`: the EAGLE-2 tree's
expansion and selection, `shapes.py` its shape and the default shapes; `accept.py`, `sampling.py`: the acceptance
rules; `prefill.py`, `graphs.py`, `vocabulary.py` (the checked draft vocabulary map), `hierarchy.py` (an
intermediate model), `batched.py` (many prompts at once, `distill-data`'s static engine). It calls a method only
through the drafter contract of specdraft.core.drafting, so methods may run it themselves (to record the traces or
labels they train on); specdraft.runtime builds it from an export."""
