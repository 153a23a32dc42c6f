"""pagellm: Qwen3 inference with a paged KV cache, from Python (vLLM's API shape).

    from pagellm import LLM, SamplingParams
    llm = LLM(model="path/to/qwen3")
    out = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))

Errors from the C++ core are raised as :class:`PagellmError` (a subclass of both
ValueError and RuntimeError) carrying the core's message.
"""
from ._core import PagellmError, has_cuda
from .async_llm import AsyncLLM
from .lora_request import LoRARequest
from .llm import LLM, Tokenizer, make_model, model_presets
from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampling_params import SamplingParams
from . import _core

__version__: str = _core.version()

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "LoRARequest", "RequestOutput", "CompletionOutput", "Logprob",
           "Tokenizer", "PagellmError", "make_model", "model_presets", "has_cuda",
           "__version__"]
