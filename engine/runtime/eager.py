"""One causal LM with its KV cache, behind the few calls the speculative loop needs.

The cache always holds the first `cache_length` tokens of the sequence the caller is building;
the caller keeps the token ids. Rolling back is cheap: the rejected positions are cut off.

This is the eager implementation on a transformers DynamicCache. A static-cache runner (fixed
buffers, compiled forwards) can replace it as long as it keeps this interface.
"""

from __future__ import annotations

import inspect

import torch

from engine.settings import DEFAULT_CONTEXT_TOKENS, context_length_of


def ids_on(device: torch.device, ids) -> torch.Tensor:
    """Token ids (a list or a tensor) as a long tensor on `device`. A list bound for a GPU goes
    through pinned memory without blocking, so the host does not wait for the GPU's queue to drain
    (a plain copy from a Python list waits for it: a host sync in every round)."""
    if isinstance(ids, torch.Tensor):
        return ids.to(device=device, dtype=torch.long)
    if device.type == "cuda":
        return torch.tensor(ids, dtype=torch.long, pin_memory=True).to(device, non_blocking=True)
    return torch.as_tensor(ids, dtype=torch.long, device=device)


class ModelRunner:
    """A Runner (engine.runtime.protocol) on a transformers DynamicCache."""

    supports_trees = False  # no tree attention on a DynamicCache: chains only (see FastRunner)
    exact_verify = False  # transformers' kernels round a call's activations together
    is_compiled = False
    verify_limit: int | None = None  # any number of tokens verifies in one forward

    def __init__(self, model, device: torch.device | None = None, tokens: int | None = None):
        """`tokens`: the positions a conversation may hold (None: the default context, never more
        than the model's own; engine.settings.cache_tokens_for gives it for a context chosen)."""
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.vocab_size = output_vocab_size(model)
        self.context_length = tokens or min(context_length_of(model.config), DEFAULT_CONTEXT_TOKENS)
        self.cache = None
        self.cache_length = 0
        self.notice = ""  # why this runner is not the fastest path, for the user
        # Opt-in for drafters that read the target's features: indices into transformers'
        # `hidden_states` to keep from every forward, as last_hidden = (first position, [n, F*C]).
        self.capture_hidden: tuple[int, ...] = ()
        self.last_hidden: tuple[int, torch.Tensor] | None = None
        # transformers renamed `past_key_values` to `cache` during 5.x
        self._cache_argument = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.cache_length = 0

    @torch.inference_mode()
    def prefill(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Appends `ids` ([n], n >= 1) to the cache; returns the logits after the last one: [V] float32."""
        return self._forward(ids, logits_to_keep=1)[-1]

    @torch.inference_mode()
    def forward(self, new_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Appends `new_ids` ([n]) to the cache; returns the logits at every new position: [n, V] float32.

        Row i scores the token that follows new_ids[i].
        """
        return self._forward(new_ids, logits_to_keep=0)

    def rollback(self, to_length: int) -> None:
        """Forget every cached position from `to_length` on."""
        assert 0 <= to_length <= self.cache_length, (to_length, self.cache_length)
        if to_length < self.cache_length:
            self.cache.crop(to_length - self.cache_length)  # a negative value removes that many tokens
            self.cache_length = to_length

    def synchronize(self) -> None:
        """Waits for queued device work; only timing needs it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compiling(self):
        return None  # transformers' forward as it is

    def static_kv_caches(self) -> list | None:
        return None  # a DynamicCache grows

    def _forward(self, ids, logits_to_keep: int) -> torch.Tensor:
        if self.cache is None:
            self.reset()
        input_ids = ids_on(self.device, ids).view(1, -1)  # [1, n]
        n = input_ids.size(1)
        assert n >= 1 and self.cache_length + n <= self.context_length, (self.cache_length, n)
        positions = torch.arange(self.cache_length, self.cache_length + n, device=self.device)  # [n]
        output = self.model(
            input_ids=input_ids,
            position_ids=positions.unsqueeze(0),
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{self._cache_argument: self.cache},
            **({"output_hidden_states": True} if self.capture_hidden else {}),
        )
        if self.capture_hidden:
            features = [output.hidden_states[i][0] for i in self.capture_hidden]  # [n, C] each
            self.last_hidden = (self.cache_length, torch.cat(features, dim=-1))
        self.cache_length += n
        return output.logits[0].float()  # [n or 1, V]


def output_vocab_size(model) -> int:
    """Rows of the LM head (the vocabulary plus any padding); works for dynamic-quantized heads too."""
    head = model.get_output_embeddings()
    size = getattr(head, "out_features", None)
    return int(size if size is not None else model.config.vocab_size)
