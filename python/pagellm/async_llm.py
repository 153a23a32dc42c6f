"""AsyncLLM: many coroutines sharing one engine (vLLM's ``AsyncLLM``).

The engine loop runs on a C++ thread and never takes the GIL: each delta is queued in C++
and an eventfd is written; the asyncio loop watches the fd (``loop.add_reader``) and drains
the queue under the GIL into one asyncio.Queue per request.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from typing import (Any, AsyncIterator, Dict, Iterable, List, Mapping, Optional, Sequence, Set,
                    Tuple, Union)

from . import _core
from .llm import (Conversation, PromptType, TextCodec, _chat_prompt, _core_prompt,
                  _engine_options, _named_tensors)
from .lora_request import LoRARequest
from .outputs import RequestOutput, convert_completion, prompt_logprobs_from_score
from .sampling_params import SamplingParams

_PAUSE_MODES = ("wait", "abort", "keep")


class AsyncLLM:
    """An engine on its own thread for many concurrent coroutines.

    ``async for out in llm.generate(prompt, params, request_id): ...`` yields a cumulative
    RequestOutput (everything so far) each time the request advances; the last has
    ``finished=True``. Leaving the loop early (break, cancellation) aborts the request.
    Constructor arguments are LLM's (``seed`` excepted). Use one asyncio event loop at a
    time; call :meth:`shutdown` (or ``async with``) when done.
    """

    def __init__(self, model: Union[str, os.PathLike], backend: str = "auto",
                 max_num_seqs: int = 256, kv_cache_gb: Optional[float] = None,
                 max_model_len: Optional[int] = None, attention_backend: str = "auto",
                 batch_invariant: bool = False, page_size: int = 16,
                 num_pages: Optional[int] = None, max_num_batched_tokens: int = 0,
                 enforce_eager: bool = False, float32_head: bool = False,
                 enable_prefix_caching: bool = True, max_loras: int = 8,
                 max_lora_rank: int = 64, tensor_parallel_size: int = 1,
                 pipelined_decode_steps: int = 1) -> None:
        options = _engine_options(
            backend, kv_cache_gb=kv_cache_gb, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, attention_backend=attention_backend,
            batch_invariant=batch_invariant, page_size=page_size, num_pages=num_pages,
            max_num_batched_tokens=max_num_batched_tokens, use_graphs=not enforce_eager,
            float32_head=float32_head, enable_prefix_caching=enable_prefix_caching,
            max_loras=max_loras, max_lora_rank=max_lora_rank,
            tensor_parallel_size=tensor_parallel_size,
            pipelined_decode_steps=pipelined_decode_steps)
        self.backend: str = options.backend
        self._core = _core.AsyncEngine(os.fspath(model), options)
        self._queues: Dict[str, "asyncio.Queue[Any]"] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ids = itertools.count()
        # Serialises _ensure_lora's check-then-load, so that two streams naming one new
        # adapter load it once (a second load would replace it in place).
        self._lora_lock = asyncio.Lock()

    # ---- the fd reader ----------------------------------------------------------------

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._core.fileno())
        loop.add_reader(self._core.fileno(), self._drain)
        self._loop = loop

    def _drain(self) -> None:
        for delta in self._core.drain():
            queue = self._queues.get(delta.request_id)
            if queue is not None:
                queue.put_nowait(delta)

    # ---- requests -----------------------------------------------------------------------

    async def generate(self, prompt: PromptType,
                       sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None,
                       lora_request: Optional[LoRARequest] = None) -> AsyncIterator[RequestOutput]:
        """Streams one prompt's outputs (see the class doc). Bad params or prompt raise
        PagellmError before the first output; a duplicate live request_id raises
        ValueError. ``lora_request``: the adapter to run with (loaded from its path first
        when its name is not loaded)."""
        async for out in self._stream(_core_prompt(prompt, 0), sampling_params, request_id,
                                      prompt if isinstance(prompt, str) else None,
                                      lora_request):
            yield out

    async def chat(self, messages: Conversation,
                   sampling_params: Optional[SamplingParams] = None,
                   request_id: Optional[str] = None,
                   chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                   lora_request: Optional[LoRARequest] = None, *,
                   add_generation_prompt: Optional[bool] = None,
                   continue_final_message: Union[bool, str] = False,
                   tools: Optional[Sequence[Mapping[str, Any]]] = None
                   ) -> AsyncIterator[RequestOutput]:
        """``generate`` for one conversation through the chat template (``LLM.chat``'s
        template arguments)."""
        prompt = _chat_prompt(messages, chat_template_kwargs, tools, add_generation_prompt,
                              continue_final_message)
        async for out in self._stream(prompt, sampling_params, request_id, None, lora_request):
            yield out

    async def _stream(self, prompt: "_core.Prompt", sampling_params: Optional[SamplingParams],
                      request_id: Optional[str], text: Optional[str],
                      lora_request: Optional[LoRARequest] = None) -> AsyncIterator[RequestOutput]:
        params = sampling_params or SamplingParams()
        cparams = params._to_core()
        lora = await self._ensure_lora(lora_request)
        self._attach()
        rid = request_id if request_id is not None else f"req-py-{next(self._ids)}"
        if rid in self._queues:
            raise ValueError(f"request_id {rid!r} is already running")
        queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._queues[rid] = queue
        finished = False
        try:
            self._core.submit(prompt, cparams, rid, lora)
            total = _core.RequestOutput()
            decode_cache: Dict[int, str] = {}

            def decode(token: int) -> str:
                if token not in decode_cache:
                    decode_cache[token] = self._core.decode([int(token)], False)
                return decode_cache[token]

            def decode_ids(ids: List[int]) -> str:
                return self._core.decode(ids, False)

            prompt_logprobs = None
            while not finished:
                _core.merge_delta(total, await queue.get())
                finished = bool(total.finished)
                if params.prompt_logprobs is not None and prompt_logprobs is None:
                    # The scoring path (between two engine steps) over the prompt, once,
                    # when the first output has brought its token ids; every later output
                    # carries the same list, as vLLM's do.
                    ids = [int(t) for t in total.prompt_token_ids]
                    scored = None
                    if len(ids) >= 2:
                        scored = (await self._call(self._core.score, [ids], [1],
                                                   params.prompt_logprobs, lora))[0]
                    prompt_logprobs = prompt_logprobs_from_score(ids, scored,
                                                                 params.prompt_logprobs, decode)
                yield RequestOutput(
                    request_id=rid,
                    prompt=text if text is not None else (total.prompt or None),
                    prompt_token_ids=list(total.prompt_token_ids),
                    outputs=[convert_completion(c, cparams, params.logprobs, decode, decode_ids)
                             for c in total.outputs],
                    finished=finished,
                    prompt_logprobs=prompt_logprobs,
                    weights_version=int(total.weights_version))
        finally:
            del self._queues[rid]
            if not finished:
                self._core.abort(rid)

    async def abort(self, request_id: str) -> None:
        """Ends the request with finish_reason "abort" and frees its pages before the next
        step; its stream yields a last output. Unknown or finished ids are ignored."""
        self._core.abort(request_id)

    # ---- RL: weights, memory, cache (run off the event loop; the GIL is released) -------

    async def _ensure_lora(self, lora_request: Optional[LoRARequest]) -> str:
        """The adapter name to submit with, loading it first when it is not loaded (the
        same rule as LLM.generate: a loaded name's path must be empty or the loaded one)."""
        if lora_request is None:
            return ""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request: expected LoRARequest or None, "
                             f"got {type(lora_request).__name__}")
        core = lora_request._to_core()
        async with self._lora_lock:
            loaded = {a.name: a for a in await self._call(self._core.list_lora_adapters)}
            if core.name not in loaded:
                await self._call(self._core.load_lora_adapter, core)
                return core.name
        path = loaded[core.name].path
        if core.path and os.path.abspath(core.path) != os.path.abspath(path):
            raise ValueError(f"lora_request: the adapter {core.name!r} is loaded from {path!r}, "
                             f"not {core.path!r}; load_lora_adapter replaces it")
        return core.name

    async def load_lora_adapter(self, lora_request: LoRARequest) -> "_core.LoraAdapterInfo":
        """LLM.load_lora_adapter, run between engine steps."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"load_lora_adapter: expected LoRARequest, "
                             f"got {type(lora_request).__name__}")
        return await self._call(self._core.load_lora_adapter, lora_request._to_core())

    async def unload_lora_adapter(self, lora_name: str) -> None:
        """Unloads an adapter; PagellmError for a name not loaded."""
        await self._call(self._core.unload_lora_adapter, str(lora_name))

    async def list_lora_adapters(self) -> List["_core.LoraAdapterInfo"]:
        """The loaded adapters, by name."""
        return list(await self._call(self._core.list_lora_adapters))

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """vLLM's name for :meth:`load_lora_adapter`; True once loaded."""
        await self.load_lora_adapter(lora_request)
        return True

    async def remove_lora(self, lora_id: Union[int, str]) -> bool:
        """vLLM's remove_lora: unloads the adapter of that ``lora_int_id`` (or name);
        False when none is loaded."""
        for a in await self.list_lora_adapters():
            if (a.name == lora_id) if isinstance(lora_id, str) else (a.id == int(lora_id)):
                await self.unload_lora_adapter(a.name)
                return True
        return False

    async def list_loras(self) -> Set[int]:
        """vLLM's list_loras: the ``lora_int_id`` of every loaded adapter."""
        return {int(a.id) for a in await self.list_lora_adapters()}

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    @property
    def weights_version(self) -> int:
        """Version of the weights the engine samples with now."""
        return int(self._core.weights_version)

    async def pause(self, mode: str = "wait") -> None:
        """Pauses generation. ``mode``: "wait" (running requests finish first), "abort"
        (they end with finish_reason "abort"), "keep" (they freeze and continue after
        resume). Requests submitted while paused wait. PagellmError when already paused."""
        if mode not in _PAUSE_MODES:
            raise ValueError(f"pause: mode must be one of {_PAUSE_MODES}, got {mode!r}")
        await self._call(self._core.pause, mode)

    async def resume(self) -> None:
        """Ends the pause; no-op when not paused."""
        await self._call(self._core.resume)

    async def update_weights(self, named_tensors: Iterable[Tuple[str, Any]],
                             mode: str = "wait") -> "_core.WeightUpdateResult":
        """LLM.update_weights between engine steps; not paused, it pauses with ``mode``
        around the update. Tensors are read in place (DLPack), so keep them alive until
        this returns."""
        tensors = _named_tensors(named_tensors)
        return await self._call(self._core.update_weights, tensors, mode)

    async def load_weights(self, path: Union[str, os.PathLike],
                           mode: str = "wait") -> "_core.WeightUpdateResult":
        """The same from a safetensors file or folder."""
        return await self._call(self._core.load_weights, os.fspath(path), mode)

    async def score(self, token_sequences: Sequence[Sequence[int]],
                    prompt_lengths: Optional[Sequence[int]] = None,
                    lora_request: Optional[LoRARequest] = None) -> List[List[float]]:
        """LLM.score between two engine steps (running requests continue after it);
        ``lora_request``: with that adapter (loaded first when its name is not)."""
        seqs = [[int(t) for t in s] for s in token_sequences]
        lengths = [int(n) for n in prompt_lengths] if prompt_lengths is not None else []
        lora = await self._ensure_lora(lora_request)
        out = await self._call(self._core.score, seqs, lengths, 0, lora)
        return [list(s.logprobs) for s in out]

    async def sleep(self, level: int = 1) -> "_core.SleepReport":
        """LLM.sleep; PagellmError while any request is unfinished."""
        if level not in (1, 2):
            raise ValueError(f"sleep: level must be 1 or 2, got {level}")
        return await self._call(self._core.sleep, level == 2)

    async def wake_up(self) -> "_core.WakeReport":
        """Brings back what sleep() released."""
        return await self._call(self._core.wake_up)

    async def reset_prefix_cache(self) -> None:
        """Forgets every cached KV page."""
        await self._call(self._core.reset_prefix_cache)

    def get_tokenizer(self) -> TextCodec:
        """encode and decode with the model's tokenizer (thread-safe)."""
        return TextCodec(self._core)

    def check_invariants_and_count_free_pages(self) -> int:
        """Checks KV page ownership on the loop thread and returns the free pages (equal
        to num_usable_pages() when idle)."""
        return int(self._core.check_invariants_and_count_free_pages())

    def num_usable_pages(self) -> int:
        """KV pages in all."""
        return int(self._core.num_usable_pages())

    def shutdown(self) -> None:
        """Aborts every request and stops the engine thread; the streams still open get
        their last output (finish_reason "abort"). Idempotent."""
        self._core.shutdown()
        self._drain()  # the final deltas, queued before the loop thread ended
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._core.fileno())
            self._loop = None

    async def __aenter__(self) -> "AsyncLLM":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.shutdown()
