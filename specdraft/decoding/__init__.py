"""Speculative decoding on the device, batch 1, knowing no method: a compact static-cache target (target.py), the
EAGLE-2 tree and the chain (tree.py, chain.py), the draft-verify cycle with CUDA graphs (engine.py, graphs.py),
acceptance policies (accept.py, sampling.py), the dynamic draft length and exit layer (dynamic_exit.py). It calls a
method only through the drafter contract of specdraft.core.drafting, so methods may run it themselves (to record
the traces or labels they train on); specdraft.runtime builds it from an export."""
