"""Run by tests/test_dflash_speculators.py in a process whose path holds the `speculators` package (installed apart,
tools/setup.sh): a tiny DFlash draft exported in the speculators layout, loaded into speculators' own
DFlashDraftModel, both run on the same target features at the same anchors -> prints the largest logit difference
(and the keys the load left missing or unexpected) as one JSON line. Argument: the draft vocabulary size, or 0 for
the target's own head."""
import json
import sys

import torch


def main(vocab: int) -> None:
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.dflash import core as speculators_core
    from transformers import LlamaForCausalLM

    from specdraft.core.types import DraftBatch, DraftContext, TargetInfo
    from specdraft.methods import get_method
    from specdraft.methods.dflash import DFlashConfig, block_inputs, block_mask, dflash_to_speculators
    from specdraft.methods.dflash.blocks import Anchors
    from specdraft.targets import capture_features
    from specdraft.testing.tiny import tiny_llama_config

    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_llama_config(layers=4)).eval()
    info, spec = TargetInfo.from_hf_config(target.config, "tiny"), get_method("dflash")
    cfg = DFlashConfig(block_size=4, num_layers=2, init_std=0.2, mask_token_id=300, draft_vocab_size=vocab or None)
    draft = spec.build(cfg, DraftContext(info, torch.randint(0, 50, (info.vocab_size,)))).eval()
    with torch.no_grad():  # norms away from 1, so that a norm read wrong shows
        for name, param in draft.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.2)
    config, tensors = dflash_to_speculators(draft, cfg, info, {"target_hub_id": "org/tiny"})
    config.pop("specdraft")
    config["transformer_layer_config"]["_attn_implementation"] = "eager"  # the dense float mask, CPU
    theirs = DFlashDraftModel(DFlashSpeculatorConfig(**config)).eval()
    report = theirs.load_state_dict(tensors, strict=False)
    with torch.no_grad():  # what speculators takes from the verifier (load_verifier_weights) taken from the target
        theirs.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        head = target.get_output_embeddings().weight
        theirs.verifier_lm_head.weight.copy_(head if not vocab else head[draft.draft_ids()])
        if not vocab:
            theirs.lm_head.weight.copy_(head)
        theirs.verifier_norm.weight.copy_(target.model.norm.weight)

    ids = torch.randint(0, 250, (1, 20), generator=torch.Generator().manual_seed(2))
    ones = torch.ones_like(ids)
    feats = capture_features(target, ids, ones, draft.feature_layers)
    anchors = Anchors(positions=torch.tensor([[3, 7, 12]]), valid=torch.ones(1, 3, dtype=torch.bool))
    speculators_core.select_anchors = lambda loss_mask, n, block: (anchors.positions[0], anchors.valid[0])
    aux = torch.cat([feats.hidden_states[i] for i in draft.feature_layers], dim=-1)
    with torch.no_grad():
        _, their_logits, _, _, _ = theirs._backbone_forward(
            aux, ids, ones, feats.final_hidden, torch.zeros_like(ids), max_anchors=3)
        tokens, positions, context_positions, _ = block_inputs(draft, DraftBatch(ids, ones, ones, feats), anchors)
        normed = draft.blocks(torch.nn.functional.embedding(tokens, feats.embed_tokens), positions,
                              draft.context(feats.hidden_states), context_positions,
                              block_mask(anchors, cfg.block_size, ids.shape[1], None, "dense"))
        our_logits = draft.logits(normed, feats.lm_head)
    print(json.dumps({"max_difference": float((their_logits - our_logits).abs().max()),
                      "scale": float(our_logits.abs().max()), "shape": list(our_logits.shape),
                      "missing": sorted(report.missing_keys), "unexpected": sorted(report.unexpected_keys)}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
