"""A draft head: one decoder layer that reads the target's own hidden states (EAGLE-3 layout).

    features   h_t: the target's hidden states at position t (one or more layers, concatenated)
    token      x_{t+1}: the token the target chose after position t
    entry t    = midlayer(fc(h_t), embed(x_{t+1}))       -> out_t, which scores x_{t+2}
    logits     = lm_head(norm(out_t))                     over a reduced vocabulary of N target ids

Drafting further than one token feeds the head its own output: entry t+1 reads out_t in place of
fc(h_{t+1}), which the target has not computed yet. The reduced vocabulary is a slice of the
target's LM head (FR-Spec, arXiv 2502.14856); `draft_ids[d]` is the target id of draft token d.
The layout (fc, midlayer, norm, lm_head, d2t, t2d) is the one published EAGLE-3 heads use, so
they load with the same code; a head trained here stores no lm_head and slices the target's.

Files: a folder with `config.json` and `model.safetensors` (or `pytorch_model.bin` is refused).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.errors import IncompatibleDraftError, ModelFormatError
from engine.kernels.weight_rows import float_rows

HEAD_CONFIG = "config.json"
HEAD_WEIGHTS = "model.safetensors"
FORMAT = "tandem-head-1"


@dataclass
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    target_hidden_size: int
    target_vocab_size: int
    draft_vocab_size: int
    # which of the target's hidden states feed the head, as indices into transformers'
    # `hidden_states` (i < num_layers: the input of layer i; num_layers: the final, normed output)
    target_layers: list[int] = field(default_factory=list)
    hidden_act: str = "silu"
    own_lm_head: bool = False  # False: lm_head rows are the target's, taken at load
    base_model: dict = field(default_factory=dict)  # name and fingerprint of the target it was trained for
    training: dict = field(default_factory=dict)  # recipe, data size and cost

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, target_layers: list[int] | None = None):
        layers = target_layers or [target_config.num_hidden_layers]
        rope = getattr(target_config, "rope_parameters", None) or {}
        return cls(
            hidden_size=target_config.hidden_size,
            intermediate_size=target_config.intermediate_size,
            num_attention_heads=target_config.num_attention_heads,
            num_key_value_heads=target_config.num_key_value_heads,
            head_dim=getattr(target_config, "head_dim", None)
            or target_config.hidden_size // target_config.num_attention_heads,
            rms_norm_eps=float(target_config.rms_norm_eps),
            rope_theta=float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))),
            target_hidden_size=target_config.hidden_size,
            target_vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            target_layers=list(layers),
            hidden_act=target_config.hidden_act,
        )

    def to_json(self) -> dict:
        return {"format": FORMAT, **asdict(self)}


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # one fused op: a draft step runs four of these, and in eager mode each op's call costs
        return self.weight * F.rms_norm(x.float(), (x.size(-1),), eps=self.eps).to(x.dtype)


class HeadAttention(nn.Module):
    """Llama attention whose projections read [embedding; feature] (2C wide), as EAGLE-3's do."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        C, H, KV, D = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.q_proj = nn.Linear(2 * C, H * D, bias=False)
        self.k_proj = nn.Linear(2 * C, KV * D, bias=False)
        self.v_proj = nn.Linear(2 * C, KV * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.n_heads, self.n_kv_heads, self.head_dim = H, KV, D


class HeadMLP(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        C, M = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(C, M, bias=False)
        self.up_proj = nn.Linear(C, M, bias=False)
        self.down_proj = nn.Linear(M, C, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if hasattr(self, "gate_up_proj"):  # fused for drafting (DraftHead.fuse_projections)
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = HeadAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = HeadMLP(config)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DraftHead(nn.Module):
    """The head's weights and its two halves of a layer (project, then finish after attention)."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        n_features = max(len(config.target_layers), 1)
        self.fc = nn.Linear(n_features * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        # EAGLE-3's maps: target id = d + d2t[d]; t2d[t] says whether target id t is in the draft vocabulary
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.target_vocab_size, dtype=torch.bool))
        # float32 whatever the weights' dtype: RoPE angles need the precision
        self.inv_freq = 1.0 / (
            config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
        )

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its activations (its linear layers may hold quantized blocks)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def draft_ids(self) -> Tensor:
        """[N] long: the target id of each draft token."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def set_vocabulary(self, draft_ids: Tensor) -> None:
        draft_ids = draft_ids.to(self.d2t.device, torch.long)
        self.d2t.copy_(draft_ids - torch.arange(draft_ids.numel(), device=draft_ids.device))
        self.t2d.zero_()
        self.t2d[draft_ids] = True

    def truncated(self, size: int) -> DraftHead:
        """The same head over its first `size` draft tokens (the most frequent, for a trained head)."""
        if size >= self.config.draft_vocab_size:
            return self
        return self._take_vocabulary(self.draft_ids[:size], self.lm_head.weight[:size].detach().clone())

    def widened(self, size: int, target_lm_head: Tensor) -> DraftHead:
        """The same head over `size` draft tokens: its own, then the target ids it lacks in id order
        (a BPE tokenizer's ids follow its merges, roughly most frequent first), with the target's LM
        head rows, which is what this head's rows are. Only for heads that borrow the target's rows."""
        if size <= self.config.draft_vocab_size:
            return self
        if self.config.own_lm_head:
            raise IncompatibleDraftError(
                "This draft head has its own LM head: its vocabulary cannot be widened."
            )
        own = self.draft_ids.cpu()
        lacking = torch.ones(target_lm_head.size(0), dtype=torch.bool)
        lacking[own] = False
        extra = lacking.nonzero().flatten()[: size - own.numel()]
        draft_ids = torch.cat([own, extra])
        return self._take_vocabulary(draft_ids, target_lm_head.detach()[draft_ids.to(target_lm_head.device)])

    def _take_vocabulary(self, draft_ids: Tensor, rows: Tensor) -> DraftHead:
        """Drafts over target ids `draft_ids` [N] from now on, with LM-head rows `rows` [N, C]."""
        weight = self.lm_head.weight
        self.lm_head.weight = nn.Parameter(rows.to(weight.device, weight.dtype), requires_grad=False)
        self.d2t = torch.zeros(draft_ids.numel(), dtype=torch.long, device=self.d2t.device)
        self.set_vocabulary(draft_ids)
        self.config.draft_vocab_size = draft_ids.numel()
        return self

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions: [..., T] -> cos, sin: [..., T, D]."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        angles = positions.float().unsqueeze(-1) * self.inv_freq  # [..., T, D/2]
        emb = torch.cat((angles, angles), dim=-1)
        dtype = self.dtype
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def project(self, hidden: Tensor, embeds: Tensor, cos: Tensor, sin: Tensor):
        """hidden, embeds: [B, T, C] -> q [B, H, T, D], k, v [B, KV, T, D], and the residual [B, T, C]."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        B, T, _ = hidden.shape
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)  # [B, T, 2C]
        if hasattr(attn, "qkv_proj"):  # fused for drafting (fuse_projections)
            q, k, v = attn.qkv_proj(x).split(attn.qkv_sizes, dim=-1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = q.view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2)
        k = k.view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        v = v.view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # broadcast over heads
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v, hidden

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q [B, H, T, D], k/v [B, KV, S, D], mask [B or 1, T, S] bool -> [B, T, H*D]."""
        attn = self.midlayer.self_attn
        G = attn.n_heads // attn.n_kv_heads
        k = k.repeat_interleave(G, dim=1)
        v = v.repeat_interleave(G, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))  # [B, H, T, D]
        B, H, T, D = y.shape
        return y.transpose(1, 2).reshape(B, T, H * D)

    def finish(self, attended: Tensor, residual: Tensor) -> Tensor:
        """The rest of the layer: [B, T, H*D] -> out [B, T, C] (pre-norm; fed back as the next feature)."""
        layer = self.midlayer
        x = residual + layer.self_attn.o_proj(attended)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def logits(self, out: Tensor) -> Tensor:
        """out [..., C] -> logits over the draft vocabulary [..., N]."""
        return self.lm_head(self.norm(out))

    def fuse_projections(self) -> DraftHead:
        """For drafting (in place): q, k, v as one linear layer and gate, up as one, each row the same
        dot product; 4 projection calls a draft step instead of 7. Files keep the separate layers."""
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp
        if hasattr(attn, "qkv_proj"):
            return self
        parts = (attn.q_proj, attn.k_proj, attn.v_proj)
        attn.qkv_proj = _joined(parts)
        attn.qkv_sizes = [part.out_features for part in parts]
        mlp.gate_up_proj = _joined((mlp.gate_proj, mlp.up_proj))
        del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj
        return self


def _joined(layers) -> nn.Linear:
    """One bias-free nn.Linear whose output is the given layers' outputs side by side."""
    weight = torch.cat([layer.weight.detach() for layer in layers])
    joined = nn.Linear(weight.size(1), weight.size(0), bias=False, device=weight.device, dtype=weight.dtype)
    joined.weight = nn.Parameter(weight, requires_grad=False)
    return joined


# --- files ----------------------------------------------------------------------------------------


def target_fingerprint(model) -> str:
    """A short hash of the target's weights (embedding rows and final norm in bfloat16) and shape."""
    config = model.config
    digest = hashlib.sha256()
    digest.update(
        f"{config.model_type}:{config.num_hidden_layers}:{config.hidden_size}:{config.vocab_size}".encode()
    )
    with torch.no_grad():
        embedding = model.get_input_embeddings()
        every_97th = torch.arange(0, embedding.num_embeddings, 97)
        rows = float_rows(embedding, every_97th).detach().to("cpu", torch.bfloat16)
        digest.update(rows.view(torch.int16).numpy().tobytes())
        digest.update(
            model.model.norm.weight.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes()
        )
    return digest.hexdigest()[:16]


def save_head(head: DraftHead, folder: Path) -> None:
    """Writes config.json and model.safetensors; a head without its own lm_head stores none."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # float16 on disk (half the size); the maps stay integers
    state = {
        name: t.detach().to("cpu", torch.float16 if t.is_floating_point() else t.dtype).contiguous()
        for name, t in head.state_dict().items()
    }
    if not head.config.own_lm_head:
        state.pop("lm_head.weight")
    state.pop("t2d")  # derived from d2t
    temporary = folder / (HEAD_WEIGHTS + ".tmp")
    save_file(state, str(temporary))
    temporary.replace(folder / HEAD_WEIGHTS)
    (folder / HEAD_WEIGHTS).chmod(0o644)  # package data: readable by everyone
    (folder / HEAD_CONFIG).write_text(json.dumps(head.config.to_json(), indent=1) + "\n")


def read_config(folder: Path) -> dict:
    path = Path(folder) / HEAD_CONFIG
    if not path.is_file():
        raise ModelFormatError(f"{folder} is not a draft head: it has no {HEAD_CONFIG}.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelFormatError(f"{path} is not valid JSON: {error}.") from None


def eagle3_config(raw: dict, target_config) -> HeadConfig:
    """A published EAGLE-3 config.json (LlamaForCausalLMEagle3) as a HeadConfig for `target_config`."""
    n = target_config.num_hidden_layers
    rope = raw.get("rope_parameters") or {}
    hidden = raw["hidden_size"]
    return HeadConfig(
        hidden_size=hidden,
        intermediate_size=raw["intermediate_size"],
        num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
        head_dim=raw.get("head_dim") or hidden // raw["num_attention_heads"],
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
        target_hidden_size=raw.get("target_hidden_size", hidden),
        target_vocab_size=raw.get("vocab_size", target_config.vocab_size),
        draft_vocab_size=raw.get("draft_vocab_size", raw.get("vocab_size")),
        # EAGLE-3 reads the inputs of layers 2, N/2 and N-3 (low, middle and high features)
        target_layers=list(raw.get("eagle_aux_hidden_state_layer_ids") or [2, n // 2, n - 3]),
        hidden_act=raw.get("hidden_act", "silu"),
        own_lm_head=True,
        base_model={"name": raw.get("_name_or_path", "")},
    )


def head_rows(linear, ids: torch.Tensor, folder) -> torch.Tensor:
    """Rows `ids` of the target's LM head as float32 on the CPU, dequantized where it is quantized."""
    rows = float_rows(linear, ids)
    if rows is None:
        raise ModelFormatError(
            f"The draft head in {folder} reads the target's LM head, and this target's quantized head "
            f"({type(linear).__name__}) does not give its weights back. Use an fp32 or INT4 target."
        )
    return rows.to("cpu", torch.float32)


def load_head(folder: Path | str, target_model, device=None, dtype=None) -> DraftHead:
    """Loads a head folder (Tandem's or a published EAGLE-3 one) for `target_model`.

    Raises IncompatibleDraftError when the head was trained for a different target.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    raw = read_config(folder)
    target_config = target_model.config
    if raw.get("format") == FORMAT:
        fields = {k: v for k, v in raw.items() if k != "format"}
        config = HeadConfig(**fields)
        expected = config.base_model.get("fingerprint")
        if expected and expected != target_fingerprint(target_model):
            raise IncompatibleDraftError(
                f"The draft head in {folder} was trained for {config.base_model.get('name', 'another model')}, "
                "not for this target: it only drafts for the model it was trained on. Train one for this "
                "model with `tandem-cli train-head`."
            )
    else:
        config = eagle3_config(raw, target_config)
    if (
        config.target_hidden_size != target_config.hidden_size
        or config.hidden_size != target_config.hidden_size
    ):
        raise IncompatibleDraftError(
            f"The draft head in {folder} reads {config.target_hidden_size}-wide hidden states, but the target's "
            f"are {target_config.hidden_size} wide."
        )
    weights_path = folder / HEAD_WEIGHTS
    if not weights_path.is_file():
        raise ModelFormatError(f"The draft head in {folder} has no {HEAD_WEIGHTS}.")
    state = load_file(str(weights_path))
    state = {
        name.removeprefix("model."): t.float() if t.is_floating_point() else t for name, t in state.items()
    }
    head = DraftHead(config)
    if "d2t" not in state:  # a full-vocabulary head
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    draft_ids = torch.arange(config.draft_vocab_size) + state.pop("d2t").long()
    state.pop("t2d", None)
    if not config.own_lm_head:
        state["lm_head.weight"] = head_rows(target_model.get_output_embeddings(), draft_ids, folder)
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if m not in ("d2t", "t2d")]
    if missing or unexpected:
        raise ModelFormatError(
            f"The draft head in {folder} does not have the expected layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})."
        )
    head.set_vocabulary(draft_ids)
    weight = target_model.get_input_embeddings().weight
    return head.to(device=device or weight.device, dtype=dtype or weight.dtype).eval()


def shipped_head_folder(target_name: str) -> Path | None:
    """resources/heads/<target name>/ when Tandem ships a head for that target, else None."""
    import resources

    for root in resources.__path__:
        folder = Path(root) / "heads" / target_name
        if (folder / HEAD_CONFIG).is_file():
            return folder
    return None


def find_head(target, source: str | Path | None = None) -> Path:
    """The head folder for `target` (a LoadedModel): `source` if given, else the one shipped for it."""
    if source:
        folder = Path(source).expanduser()
        if not (folder / HEAD_CONFIG).is_file():
            raise ModelFormatError(f"{folder} is not a draft head folder (no {HEAD_CONFIG} in it).")
        return folder
    folder = shipped_head_folder(target.name)
    if folder is None:
        raise IncompatibleDraftError(
            f"No draft head ships for {target.name}. Train one with `tandem-cli train-head --target "
            f"{target.spec} --out DIR` and use it with --draft head:DIR."
        )
    return folder
