"""SamplingParams: how one request is sampled, vLLM's fields and defaults."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

from . import _core


@dataclass
class SamplingParams:
    """How to sample one prompt, shaped like vLLM's ``SamplingParams``.

    Penalties apply to the raw logits, then temperature, then the top-k, top-p and min-p
    filters (vLLM's order); ``temperature=0`` is greedy. A request with a ``seed`` draws the
    same tokens in any batch; sample ``j`` of ``n`` uses ``seed + j``.

    ``logprobs``: None reports no per-token dicts; ``k >= 0`` fills
    ``CompletionOutput.logprobs`` with, per output token, a dict ``{token_id: Logprob}``
    holding the sampled token and the ``k`` most likely ones (vLLM's shape). The flat
    per-token log-probability of each sampled token is always in
    ``CompletionOutput.token_logprobs``.

    ``prompt_logprobs``: None or ``k >= 0``: ``RequestOutput.prompt_logprobs`` holds None for
    the first prompt token and then a ``{token_id: Logprob}`` dict per prompt token (the
    token itself plus the ``k`` most likely), computed by the engine's scoring path
    (``LLM.score``) after generation.

    ``min_tokens``: until a sample has this many tokens, EOS (unless ``ignore_eos``) and
    ``stop_token_ids`` are masked out (never sampled) and stop strings do not match
    (vLLM's semantics); 0..max_tokens.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    seed: Optional[int] = None
    stop: Union[None, str, List[str]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    processed_logprobs: bool = False

    def _to_core(self) -> "_core.SamplingParams":
        """The C++ SamplingParams; raises ValueError naming a field of the wrong type or
        range (the library checks ranges again with its own message)."""
        if isinstance(self.seed, int) and not 0 <= self.seed < 2**64:
            raise ValueError(f"invalid sampling parameters: seed must be in [0, 2^64), got {self.seed}")
        p = _core.SamplingParams()
        try:
            p.n = int(self.n)
            p.temperature = float(self.temperature)
            p.top_p = float(self.top_p)
            p.top_k = int(self.top_k)
            p.min_p = float(self.min_p)
            p.repetition_penalty = float(self.repetition_penalty)
            p.presence_penalty = float(self.presence_penalty)
            p.frequency_penalty = float(self.frequency_penalty)
            # vLLM: max_tokens=None means "up to the context limit" (the engine ends the
            # sample at max_model_len with finish_reason "length").
            p.max_tokens = int(self.max_tokens) if self.max_tokens is not None else 2**31 - 1
            p.seed = None if self.seed is None else int(self.seed)
            p.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
            p.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
            p.ignore_eos = bool(self.ignore_eos)
            p.skip_special_tokens = bool(self.skip_special_tokens)
            p.processed_logprobs = bool(self.processed_logprobs)
            p.logprobs = 0 if self.logprobs is None else int(self.logprobs)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"invalid sampling parameters: {e}") from None
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(
                f"invalid sampling parameters: logprobs must be None or 0..20, got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise ValueError("invalid sampling parameters: prompt_logprobs must be None or "
                             f"0..20, got {self.prompt_logprobs}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(
                f"invalid sampling parameters: min_tokens must be an int >= 0, got {self.min_tokens!r}")
        p.min_tokens = self.min_tokens
        p.validate()
        return p
