"""The draft head in 8-bit blocks on a CPU: its LM head and its layer's projections at a quarter of
their bytes.

A head step streams every weight of the head from memory (the target's weights pushed them out of
the cache), so it costs about what its bytes cost. With the LM head alone in blocks (N x C, 4.7M
weights for the shipped head), the layer's seven float32 projections still took about 1.3 ms a step on
an AVX2 EPYC, and a 2-token head draft cost 7.1 ms; with them in blocks too, 5.3 ms. (Before the
block kernel prefetched its rows, the whole head in blocks drafted no faster than float32.) The input
projection `fc` stays float: it runs over many rows of features at once, where the float kernel is
the faster one.

A draft's precision never touches Tandem's output: the target verifies every draft token, and at
T > 0 the loop tests each one against the distribution the head really drew it from. It only changes
how often the head's tokens are kept. So the quantized head is used only where the block kernel
runs and it agrees with its float self on this machine: the check feeds both the target's own
features over a few probe texts and keeps the quantized one when their first choices agree on at
least MIN_AGREEMENT of the positions. The result is cached per machine, head and torch.
"""

from __future__ import annotations

import copy
import hashlib

import torch
from torch import nn

from engine.heads.head import DraftHead
from engine.heads.training import chained_log_probs
from engine.kernels import quant_check

MIN_AGREEMENT = 0.95
KERNEL = "head-int8-block-q8_0"
VERSION = 2


def unavailable_reason(head: DraftHead) -> str | None:
    """None when the block kernel can hold this head here, else why the head stays float."""
    from engine.kernels import block_quant

    if head.device.type != "cpu":
        return f"the block kernel is for CPUs, and the head runs on {head.device.type}"
    if head.dtype != torch.float32:
        return f"the block kernel takes float32 activations, and the head runs in {dtype_name(head)}"
    error = block_quant.build_error()
    if error is not None:
        return error
    if any(
        type(m) is not nn.Linear or m.in_features % block_quant.PAIR for m in quantized_layers(head).values()
    ):
        return f"its layers' widths are not multiples of {block_quant.PAIR}"
    return None


def quantized_layers(head: DraftHead) -> dict[str, nn.Module]:
    """The head's modules held in blocks, by name: the LM head and the layer's projections."""
    names = ["lm_head"]
    names += [f"midlayer.self_attn.{name}" for name in ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")]
    names += [f"midlayer.mlp.{name}" for name in ("gate_proj", "up_proj", "gate_up_proj", "down_proj")]
    modules = dict(head.named_modules())
    return {name: modules[name] for name in names if name in modules}


def dtype_name(head: DraftHead) -> str:
    return str(head.dtype).removeprefix("torch.")


def quantized_copy(head: DraftHead) -> DraftHead:
    """A copy of `head` whose LM head and layer projections hold 8-bit blocks (`fc` still float)."""
    from engine.kernels.block_quant import BlockQuantLinear

    quantized = copy.deepcopy(head)
    for name, layer in quantized_layers(quantized).items():
        parent_name, _, child = name.rpartition(".")
        parent = quantized.get_submodule(parent_name) if parent_name else quantized
        bias = None if layer.bias is None else layer.bias.detach()
        setattr(parent, child, BlockQuantLinear.quantized(layer.weight.detach(), bias, 8))
    return quantized


def quantized_if_agrees(head: DraftHead, target) -> tuple[DraftHead, str]:
    """The quantized head when it runs here and passes the check, else `head`; and a line saying which."""
    reason = unavailable_reason(head)
    if reason is not None:
        return head, f"Draft head in {dtype_name(head)} ({reason})."
    key = quant_check.machine_key(KERNEL, VERSION, head_fingerprint(head))
    cached = quant_check.read_cache().get(key, {}).get("agreement")
    quantized = None  # built only to be checked, or once it passed
    if cached is None:
        quantized = quantized_copy(head)
        cached = agreement(head, quantized, target)
        quant_check.write_cache_entry(key, {"kernel": KERNEL, "agreement": round(cached, 4)})
    if cached < MIN_AGREEMENT:
        return head, (
            f"Draft head in {dtype_name(head)}: in 8-bit blocks it agreed with itself on {cached:.0%} of the check's "
            f"tokens here (needs {MIN_AGREEMENT:.0%})."
        )
    if quantized is None:
        quantized = quantized_copy(head)
    return quantized, f"Draft head in 8-bit blocks ({cached:.0%} agreement with float32 here)."


@torch.inference_mode()
def agreement(head: DraftHead, quantized: DraftHead, target) -> float:
    """Share of probe positions where both heads, fed the target's features, choose the same token."""
    same = total = 0
    embed = target.model.get_input_embeddings()
    for ids in quant_check.probe_inputs(target.tokenizer, head.device):
        features = target_features(target.model, ids, head.config.target_layers)[None]  # [1, n, F*C]
        choices = [
            chained_log_probs(h, embed, ids[None], features, 1)[0].argmax(-1) for h in (head, quantized)
        ]
        same += int((choices[0] == choices[1]).sum())
        total += choices[0].numel()
    return same / max(total, 1)


def target_features(model, ids: torch.Tensor, layers) -> torch.Tensor:
    """The target's hidden states at `layers` over `ids` ([n]), side by side: [n, len(layers) * C]."""
    output = model(input_ids=ids.view(1, -1), output_hidden_states=True, use_cache=False)
    return torch.cat([output.hidden_states[i][0] for i in layers], dim=-1).float()


def head_fingerprint(head: DraftHead) -> str:
    """A short hash of the head's shape and a sample of its weights (its identity in the check cache)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(head.state_dict().items()):
        flat = tensor.detach().flatten()
        digest.update(f"{name}:{tuple(tensor.shape)}".encode())
        digest.update(flat[:: max(1, flat.numel() // 64)].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
