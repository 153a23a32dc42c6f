"""LoRARequest: a LoRA adapter for a request, by vLLM's name and field order."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from . import _core


@dataclass(frozen=True)
class LoRARequest:
    """Selects a LoRA adapter (vLLM's ``LoRARequest(lora_name, lora_int_id, lora_path)``).

    The name is the key: a request naming an adapter not loaded yet loads it from
    ``lora_path`` (a PEFT folder: adapter_config.json and adapter_model.safetensors); a
    loaded name runs with the loaded adapter (``lora_path`` must then be empty or the
    loaded folder). ``lora_int_id`` is the caller's own number, reported back by
    ``list_lora_adapters``; the engine does not use it.
    """

    lora_name: str
    lora_int_id: int = 0
    lora_path: str = ""

    def _to_core(self) -> "_core.LoraRequest":
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest.lora_name: must be a non-empty string, "
                             f"got {self.lora_name!r}")
        r = _core.LoraRequest()
        r.name = self.lora_name
        r.id = int(self.lora_int_id)
        r.path = os.fspath(self.lora_path) if self.lora_path else ""
        return r


LoRARequestArg = Union[None, LoRARequest, Sequence[Optional[LoRARequest]]]


def core_lora_requests(lora_request: LoRARequestArg, prompts: int) -> List["_core.LoraRequest"]:
    """``lora_request`` as the core takes it: [] (none), [one for all], or one per prompt
    (None in the list: the base model for that prompt)."""
    if lora_request is None:
        return []
    if isinstance(lora_request, LoRARequest):
        return [lora_request._to_core()]
    items = list(lora_request)
    if len(items) != prompts:
        raise ValueError(f"lora_request: {len(items)} LoRARequests for {prompts} prompts "
                         f"(give one for all, one per prompt, or None)")
    out = []
    for i, r in enumerate(items):
        if r is None:
            out.append(_core.LoraRequest())
        elif isinstance(r, LoRARequest):
            out.append(r._to_core())
        else:
            raise ValueError(f"lora_request[{i}]: expected LoRARequest or None, "
                             f"got {type(r).__name__}")
    return out
