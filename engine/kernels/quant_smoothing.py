"""SmoothQuant-style smoothing (arXiv 2211.10438) and the layer surgery quantized kernels need:
activation outliers move into the weights, folded into the preceding norm so decoding pays nothing."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

SMOOTH_ALPHA = 0.5


def untie_lm_head(model: nn.Module) -> None:
    """Give the LM head its own weight so quantizing it leaves the input embedding a float gather."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if head is not None and embed is not None and head.weight is embed.weight:
        head.weight = nn.Parameter(embed.weight.detach().clone(), requires_grad=False)
        if hasattr(model, "config"):
            model.config.tie_word_embeddings = False


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, module) for name, module in model.named_modules() if type(module) is nn.Linear]


def replace_linears(model: nn.Module, make: Callable, smoothing: dict[str, torch.Tensor]) -> None:
    """Swap every nn.Linear for make(weight, bias[, inverse_scale]); a layer in `smoothing` (whose
    weight columns were already multiplied by its scales) divides its input by them."""
    for name, linear in linear_layers(model):
        weight = linear.weight.detach()
        scale = smoothing.get(name)
        if scale is None:
            quantized = make(weight, linear.bias)
        else:
            quantized = make(weight, linear.bias, (1 / scale).to(weight.dtype))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, quantized)


@torch.inference_mode()
def input_channel_maxima(model: nn.Module, inputs: list[torch.Tensor]):
    """Run the float model over `inputs` ([n] ids each), recording max |x_j| at the input of every
    nn.Linear. Returns (name -> [K] maxima, the logits of each input: [n, V] float32)."""
    maxima: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_module, args, _output):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
            maxima[name] = torch.maximum(maxima[name], x) if name in maxima else x

        return record

    handles = [linear.register_forward_hook(hook(name)) for name, linear in linear_layers(model)]
    try:
        logits = [model(input_ids=ids.view(1, -1), use_cache=False).logits[0].float() for ids in inputs]
    finally:
        for handle in handles:
            handle.remove()
    return maxima, logits


def smoothing_scales(model: nn.Module, input_maxima: dict[str, torch.Tensor], alpha: float = SMOOTH_ALPHA):
    """SmoothQuant scales s_j = max|x_j|^alpha / max|w_j|^(1-alpha) per nn.Linear: name -> [K]."""
    scales = {}
    linears = dict(linear_layers(model))
    for name, x_max in input_maxima.items():
        if name not in linears:
            continue
        weight = linears[name].weight.detach()
        w_max = weight.abs().amax(0).float().clamp(min=1e-5)  # [K]
        scale = (x_max.to(w_max.device).clamp(min=1e-5) ** alpha) / (w_max ** (1 - alpha))
        scales[name] = scale.clamp(min=1e-2, max=1e2).to(weight.dtype)
    return scales


# RMSNorms that compute weight * normalized(x), so dividing their weight by s divides their output by s.
FOLDABLE_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


def _scale(x_max: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_max = torch.stack([w.detach().abs().amax(0).float() for w in weights]).amax(0).clamp(min=1e-5)  # [K]
    scale = (x_max.to(w_max.device).clamp(min=1e-5) ** alpha) / (w_max ** (1 - alpha))
    return scale.clamp(min=1e-2, max=1e2)


@torch.no_grad()
def fold_smoothing(model: nn.Module, input_maxima: dict[str, torch.Tensor], alpha: float = SMOOTH_ALPHA):
    """Smooth every nn.Linear's input; where the input comes from an RMSNorm (q/k/v, gate/up, the
    LM head) or from up_proj (down_proj), fold 1/s into that module's weight so decoding pays no
    extra op. Weight columns are multiplied by s in place. Returns the scales of the layers left
    to divide their own input (name -> [K])."""
    linears = dict(linear_layers(model))
    folded: set[str] = set()

    def fold(divide: torch.Tensor, names: list[str], rows: bool = False) -> None:
        present = [n for n in names if n in linears and n in input_maxima]
        if len(present) != len(names):
            return
        scale = _scale(input_maxima[names[0]], [linears[n].weight for n in names], alpha)
        # `divide` is a norm's weight [K], or up_proj's weight [K, hidden] whose rows feed down_proj
        divide.div_((scale[:, None] if rows else scale).to(divide.dtype))
        for name in names:
            linears[name].weight.mul_(scale.to(linears[name].weight.dtype))
            folded.add(name)

    for prefix, module in model.named_modules():
        attn, mlp = getattr(module, "self_attn", None), getattr(module, "mlp", None)
        norm = getattr(module, "input_layernorm", None)
        post = getattr(module, "post_attention_layernorm", None)
        if attn is None or mlp is None or norm is None or post is None:
            continue
        if type(norm).__name__ in FOLDABLE_NORMS:
            fold(norm.weight, [f"{prefix}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")])
        if type(post).__name__ in FOLDABLE_NORMS:
            fold(post.weight, [f"{prefix}.mlp.{p}" for p in ("gate_proj", "up_proj")])
        up = getattr(mlp, "up_proj", None)
        if type(up) is nn.Linear and type(getattr(mlp, "down_proj", None)) is nn.Linear:
            fold(up.weight, [f"{prefix}.mlp.down_proj"], rows=True)
    inner = getattr(model, "model", None)
    final_norm = getattr(inner, "norm", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(final_norm).__name__ in FOLDABLE_NORMS and type(head) is nn.Linear:
        head_name = next((n for n, m in linears.items() if m is head), None)
        if head_name is not None:
            fold(final_norm.weight, [head_name])
    rest = {n: s for n, s in smoothing_scales(model, input_maxima, alpha).items() if n not in folded}
    for name, scale in rest.items():
        linears[name].weight.mul_(scale)
    return rest
