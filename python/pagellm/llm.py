"""LLM: offline generation over a model folder (vLLM's ``LLM``), its tokenizer, make_model."""
from __future__ import annotations

import json
import numbers
import os
import sys
import threading
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set,
                    Tuple, Union)

from . import _core
from .lora_request import LoRARequest, LoRARequestArg, core_lora_requests
from .outputs import (Logprob, LogprobDict, RequestOutput, convert_completion,
                      prompt_logprobs_from_score)
from .sampling_params import SamplingParams

#: A prompt: text, token ids, or vLLM's ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``.
PromptType = Union[str, Sequence[int], Mapping[str, Any]]
#: A chat conversation: a list of message dicts (``{"role": ..., "content": ...}``).
Conversation = List[Mapping[str, Any]]

PagellmError = _core.PagellmError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def make_model(out_dir: Union[str, os.PathLike], preset: str = "tiny", seed: int = 0,
               dtype: str = "bfloat16") -> str:
    """Writes a random-weight Qwen3 model folder with its tokenizer (what ``pagellm
    make-model`` writes) and returns its path.

    ``preset``: one of :func:`model_presets` ("tiny" is for tests: V=1024, 2 layers).
    ``dtype``: "float32", "bfloat16" or "float16". The qwen3-* presets get Qwen3's real
    tokenizer (shipped in the package); "tiny" gets a small byte-level one.
    """
    out = os.fspath(out_dir)
    if preset not in _core.model_presets():
        raise ValueError(f"make_model: unknown preset {preset!r}; accepted: "
                         f"{', '.join(_core.model_presets())}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"make_model: seed must be an int >= 0, got {seed!r}")
    _core.make_model(out, preset, seed, dtype, _PACKAGE_DIR)
    return out


def model_presets() -> List[str]:
    """The presets :func:`make_model` accepts."""
    return list(_core.model_presets())


class TextCodec:
    """encode/decode with the model's tokenizer (Qwen3's byte-level BPE), computed by the
    C++ core; what ``AsyncLLM.get_tokenizer()`` returns."""

    def __init__(self, core: Any) -> None:
        self._core = core

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` (special tokens written in it count as special)."""
        return list(self._core.encode(text))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``."""
        return self._core.decode([int(t) for t in token_ids], skip_special_tokens)


class Tokenizer(TextCodec):
    """The model's tokenizer (what ``LLM.get_tokenizer()`` returns): encode/decode and the
    chat template, computed by the C++ core."""

    def apply_chat_template(self, messages: Conversation, tokenize: bool = False,
                            add_generation_prompt: Optional[bool] = None,
                            continue_final_message: Union[bool, str] = False,
                            tools: Optional[Sequence[Mapping[str, Any]]] = None,
                            **chat_template_kwargs: Any) -> Union[str, List[int]]:
        """The prompt the chat template renders for ``messages`` (text, or its ids with
        ``tokenize=True``), as transformers' ``apply_chat_template`` renders it. The
        assistant's turn is opened unless ``add_generation_prompt=False`` or
        ``continue_final_message`` (True: the final message's content left open for the
        model to continue; a string: that field, e.g. ``"reasoning_content"``); both at once
        raise. ``tools``: JSON schemas the template describes to the model. Extra keyword
        arguments are template variables (for example ``enable_thinking=False``)."""
        prompt = _chat_prompt(messages, chat_template_kwargs, tools, add_generation_prompt,
                              continue_final_message)
        if tokenize:
            return list(self._core.prompt_token_ids(prompt))
        return self._core.apply_chat_template(prompt)


def _chat_prompt(messages: Conversation, kwargs: Optional[Mapping[str, Any]],
                 tools: Optional[Sequence[Mapping[str, Any]]] = None,
                 add_generation_prompt: Optional[bool] = None,
                 continue_final_message: Union[bool, str] = False) -> "_core.Prompt":
    """The core's chat prompt: the messages, or (with tools or turn arguments) the object
    form {"messages", "tools", "add_generation_prompt", "continue_final_message"}; None for
    add_generation_prompt opens the assistant's turn unless the final message continues."""
    request: Dict[str, Any] = {"messages": list(messages)}
    if tools is not None:
        request["tools"] = list(tools)
    if add_generation_prompt is not None:
        request["add_generation_prompt"] = bool(add_generation_prompt)
    if continue_final_message:
        request["continue_final_message"] = continue_final_message
    try:
        messages_json = json.dumps(request if len(request) > 1 else request["messages"])
        kwargs_json = json.dumps(dict(kwargs)) if kwargs else ""
    except (TypeError, ValueError) as e:
        raise ValueError(f"chat messages must be JSON-serialisable dicts: {e}") from None
    return _core.Prompt.from_messages_json(messages_json, kwargs_json)


def _as_ids(prompt: Any) -> Any:
    # numpy arrays and torch tensors of ids become lists.
    return prompt.tolist() if hasattr(prompt, "tolist") and not isinstance(prompt, str) else prompt


def _core_prompt(prompt: PromptType, index: int) -> "_core.Prompt":
    prompt = _as_ids(prompt)
    if isinstance(prompt, str):
        return _core.Prompt.from_text(prompt)
    if isinstance(prompt, Mapping):
        if "prompt_token_ids" in prompt:
            return _core.Prompt.from_token_ids([int(t) for t in prompt["prompt_token_ids"]])
        if "prompt" in prompt:
            return _core.Prompt.from_text(str(prompt["prompt"]))
        raise ValueError(f"prompt {index}: a dict prompt needs 'prompt' or 'prompt_token_ids'")
    if isinstance(prompt, Sequence) and all(isinstance(t, numbers.Integral) for t in prompt):
        return _core.Prompt.from_token_ids([int(t) for t in prompt])
    raise ValueError(f"prompt {index}: expected a str, a list of token ids or a dict, "
                     f"got {type(prompt).__name__}")


def _is_single_prompt(prompts: Any) -> bool:
    prompts = _as_ids(prompts)
    if isinstance(prompts, (str, Mapping)):
        return True
    return (isinstance(prompts, Sequence) and len(prompts) > 0 and
            all(isinstance(t, numbers.Integral) for t in prompts))


def _named_tensors(named_tensors: Iterable[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The pairs as a list, once torch's pending GPU work on them is done: the core reads
    device tensors on its own stream, which does not wait for torch's."""
    tensors = [(str(name), tensor) for name, tensor in named_tensors]
    torch = sys.modules.get("torch")
    if torch is not None and any(isinstance(t, torch.Tensor) and t.is_cuda for _, t in tensors):
        torch.cuda.synchronize()
    return tensors


def _engine_options(backend: str, **kw: Any) -> "_core.EngineOptions":
    o = _core.EngineOptions()
    if backend == "auto":
        backend = "cuda" if _core.has_cuda and _core.cuda_device_count() > 0 else "cpu"
    elif backend not in ("cpu", "cuda"):
        raise ValueError(f"backend must be 'auto', 'cuda' or 'cpu', got {backend!r}")
    if backend == "cuda" and not _core.has_cuda:
        raise ValueError("backend='cuda': this pagellm was built without the CUDA backend "
                         "(no nvcc when it was built); use backend='cpu' or 'auto'")
    o.backend = backend
    kv_cache_gb = kw.pop("kv_cache_gb")
    if kv_cache_gb is not None:
        if kv_cache_gb <= 0:
            raise ValueError(f"kv_cache_gb must be > 0 (or None: a default share), got {kv_cache_gb}")
        o.kv_cache_bytes = int(kv_cache_gb * (1 << 30))
    for name, value in kw.items():
        if value is None:
            continue
        try:
            setattr(o, name, value)
        except TypeError:
            raise ValueError(f"{name}: expected {type(getattr(o, name)).__name__}, "
                             f"got {value!r}") from None
    return o


class LLM:
    """Offline generation over a Qwen3 model folder, shaped like vLLM's ``LLM``.

    Args:
        model: the model folder (config.json, safetensors, tokenizer.json).
        backend: "auto" (cuda when built with it and a GPU is visible, else cpu), "cuda"
            or "cpu".
        max_num_seqs: most samples running at once.
        kv_cache_gb: GiB for the KV cache (None: a quarter of RAM up to 4 GiB on the CPU,
            90 % of free memory on a GPU).
        max_model_len: longest prompt + output (None: the model's).
        attention_backend: "auto", "native" or "cudnn" (cuda backend).
        batch_invariant: the same bits whatever else runs in the batch.
        seed: default seed for requests without their own: request r (counting from 0
            over this LLM's life) gets ``seed + r * 65536``; None keeps the engine's
            deterministic per-request seeds.
        page_size, num_pages, max_num_batched_tokens, enforce_eager (no graphs),
        float32_head, enable_prefix_caching: the engine's options (EngineOptions).
            ``LLM`` is offline (``EngineOptions.offline``): max_num_batched_tokens 0 takes
            the backend's throughput chunk (16,384 tokens on a GPU of 70 GiB or more,
            where ``AsyncLLM`` and the server take 8,192).
        max_loras: LoRA adapters loaded at once (adapter slots).
        max_lora_rank: the largest LoRA rank an adapter may have (1..64; higher ranks are
            refused at load; the CUDA decode kernels are sized by it).
        tensor_parallel_size: split the model over this many ranks, one process each
            (this one and pagellm-worker processes; rank r on GPU r). LoRA, weight
            updates and sleep are refused above 1.
        pipelined_decode_steps: run up to this many decode steps back to back, each
            launched before the previous one's tokens reach the host (1: off; default
            ``_core.OFFLINE_PIPELINED_DECODE_STEPS``, 8, as ``pagellm generate`` and
            ``bench``: ``generate`` returns whole outputs, so nothing waits on single
            tokens). The tokens are the same either way.

    The GIL is released while the engine runs; calls from several threads take turns (a
    lock), as the engine steps on the caller's thread: that includes the reads of engine
    state (weights_version, num_free_pages, is_sleeping, prefix_cache_stats,
    list_lora_adapters), which wait for a call running on another thread to end. The
    tokenizer (get_tokenizer) needs no turn. Ctrl-C during ``generate`` aborts it
    cleanly (every request's pages freed; the LLM stays usable) and raises
    KeyboardInterrupt. Errors: ``PagellmError`` (a ValueError and RuntimeError) with the
    core's message.
    """

    def __init__(self, model: Union[str, os.PathLike], backend: str = "auto",
                 max_num_seqs: int = 256, kv_cache_gb: Optional[float] = None,
                 max_model_len: Optional[int] = None, attention_backend: str = "auto",
                 batch_invariant: bool = False, seed: Optional[int] = None,
                 page_size: int = 16, num_pages: Optional[int] = None,
                 max_num_batched_tokens: int = 0, enforce_eager: bool = False,
                 float32_head: bool = False, enable_prefix_caching: bool = True,
                 max_loras: int = 8, max_lora_rank: int = 64,
                 tensor_parallel_size: int = 1,
                 pipelined_decode_steps: int = _core.OFFLINE_PIPELINED_DECODE_STEPS) -> None:
        options = _engine_options(
            backend, kv_cache_gb=kv_cache_gb, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, attention_backend=attention_backend,
            batch_invariant=batch_invariant, page_size=page_size, num_pages=num_pages,
            max_num_batched_tokens=max_num_batched_tokens, use_graphs=not enforce_eager,
            float32_head=float32_head, enable_prefix_caching=enable_prefix_caching,
            max_loras=max_loras, max_lora_rank=max_lora_rank,
            tensor_parallel_size=tensor_parallel_size,
            pipelined_decode_steps=pipelined_decode_steps, offline=True)
        self.backend: str = options.backend
        self._core = _core.LLM(os.fspath(model), options)
        # The core runs on the calling thread and is not reentrant; it releases the GIL, so
        # calls from several Python threads are serialised here.
        self._lock = threading.Lock()
        self._seed = seed
        self._requests = 0
        self._paused = False

    # ---- generation -------------------------------------------------------------------

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
                 use_tqdm: Union[bool, Callable[..., Any]] = True,
                 lora_request: LoRARequestArg = None) -> List[RequestOutput]:
        """Generates for every prompt (text, token ids, or a mix) and returns one
        RequestOutput per prompt, in input order. ``sampling_params``: one for all, one
        per prompt, or None (defaults). ``use_tqdm``: a progress bar over finished prompts
        (True, or a tqdm-like factory, as vLLM). ``lora_request``: a LoRARequest for all
        prompts, a list with one per prompt (None: the base model), or None."""
        if _is_single_prompt(prompts):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        core_prompts = [_core_prompt(p, i) for i, p in enumerate(prompts)]
        return self._run(core_prompts, sampling_params, use_tqdm, [
            p if isinstance(p, str) else (p.get("prompt") if isinstance(p, Mapping) else None)
            for p in prompts], lora_request)

    def chat(self, messages: Union[Conversation, Sequence[Conversation]],
             sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
             use_tqdm: Union[bool, Callable[..., Any]] = True,
             chat_template_kwargs: Optional[Mapping[str, Any]] = None,
             lora_request: LoRARequestArg = None, *,
             add_generation_prompt: Optional[bool] = None,
             continue_final_message: Union[bool, str] = False,
             tools: Optional[Sequence[Mapping[str, Any]]] = None) -> List[RequestOutput]:
        """Generates for one conversation (a list of message dicts) or a list of them,
        through the model's chat template. ``chat_template_kwargs``: extra template
        variables, e.g. ``{"enable_thinking": False}``. ``lora_request``: as in generate.
        ``tools``, ``add_generation_prompt`` and ``continue_final_message`` (to continue a
        partial final message): as in ``Tokenizer.apply_chat_template``, vLLM's names."""
        if len(messages) > 0 and isinstance(messages[0], Mapping):
            conversations = [messages]
        else:
            conversations = list(messages)  # type: ignore[arg-type]
        core_prompts = [_chat_prompt(c, chat_template_kwargs, tools, add_generation_prompt,
                                     continue_final_message) for c in conversations]
        return self._run(core_prompts, sampling_params, use_tqdm, None, lora_request)

    def _run(self, core_prompts: List["_core.Prompt"],
             sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]],
             use_tqdm: Union[bool, Callable[..., Any]],
             texts: Optional[List[Optional[str]]],
             lora_request: LoRARequestArg = None) -> List[RequestOutput]:
        core_loras = core_lora_requests(lora_request, len(core_prompts))
        if self._paused:
            raise PagellmError("generate: the LLM is paused; call resume() first")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params]
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(core_prompts):
                raise ValueError(f"generate: {len(params_list)} SamplingParams for "
                                 f"{len(core_prompts)} prompts (give one for all or one per prompt)")
        for i, p in enumerate(params_list):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params[{i}]: expected SamplingParams, "
                                 f"got {type(p).__name__}")
        core_params = [p._to_core() for p in params_list]
        if self._seed is not None and len(core_params) == 1 and len(core_prompts) > 1:
            # Per-request seeds need one params object per prompt.
            core_params = [params_list[0]._to_core() for _ in core_prompts]
            params_list = params_list * len(core_prompts)
        bar = _progress_bar(use_tqdm, len(core_prompts))

        def on_step(finished: int, total: int) -> bool:
            if bar is not None and finished > bar.n:
                bar.update(finished - bar.n)
            return True

        try:
            with self._lock:
                # Requests are numbered under the lock, in the order the calls run, so that
                # calls from several threads never share a number (and a seed).
                if self._seed is not None:
                    for r, p in enumerate(core_params):
                        if p.seed is None:
                            p.seed = self._seed + (self._requests + r) * 65536
                results = self._core.generate(core_prompts, core_params, core_loras, on_step)
                self._requests += len(core_prompts)
        finally:
            if bar is not None:
                bar.close()
        outputs = []
        for i, r in enumerate(results):
            params = params_list[0] if len(params_list) == 1 else params_list[i]
            cparams = core_params[0] if len(core_params) == 1 else core_params[i]
            outputs.append(self._convert(r, params, cparams,
                                         texts[i] if texts is not None else r.prompt))
        # The adapter of each prompt (its name; "" the base model), for the prompt's score.
        names = [r.name for r in core_loras]
        if len(names) == 1:
            names = names * len(outputs)
        self._add_prompt_logprobs(outputs, params_list, names)
        return outputs

    def _convert(self, r: "_core.RequestOutput", params: SamplingParams,
                 cparams: "_core.SamplingParams", prompt: Optional[str]) -> RequestOutput:
        decode = self._token_decoder()
        return RequestOutput(
            request_id=r.request_id,
            prompt=prompt if prompt is not None else (r.prompt or None),
            prompt_token_ids=list(r.prompt_token_ids),
            outputs=[convert_completion(c, cparams, params.logprobs, decode, self._decode_ids)
                     for c in r.outputs],
            finished=bool(r.finished),
            weights_version=int(r.weights_version))

    def _decode_ids(self, ids: List[int]) -> str:
        return self._core.decode(ids, False) if self._core.has_tokenizer else ""

    def _token_decoder(self) -> Callable[[int], str]:
        cache: Dict[int, str] = {}

        def decode(token: int) -> str:
            if token not in cache:
                cache[token] = self._decode_ids([int(token)])
            return cache[token]
        return decode

    def _add_prompt_logprobs(self, outputs: List[RequestOutput],
                             params_list: List[SamplingParams],
                             lora_names: List[str]) -> None:
        # prompt_logprobs come from the scoring path (the same prefill forward, no
        # sampling) over each prompt, after generation.
        wanted = [(i, params_list[0] if len(params_list) == 1 else params_list[i])
                  for i in range(len(outputs))]
        wanted = [(i, p.prompt_logprobs) for i, p in wanted if p.prompt_logprobs is not None]
        if not wanted:
            return
        decode = self._token_decoder()
        for i, k in wanted:
            ids = outputs[i].prompt_token_ids
            scored = None
            if len(ids) >= 2:
                with self._lock:
                    scored = self._core.score([ids], [1], k,
                                              lora_names[i] if lora_names else "")[0]
            outputs[i].prompt_logprobs = prompt_logprobs_from_score(ids, scored, k, decode)

    # ---- scoring ----------------------------------------------------------------------

    def score(self, token_sequences: Sequence[Sequence[int]],
              prompt_lengths: Optional[Sequence[int]] = None,
              lora_request: Optional[LoRARequest] = None) -> List[List[float]]:
        """Per sequence, the raw log-probability of every token after its first
        ``prompt_lengths[i]`` (None: 1 each, every token after the first); nothing is
        sampled. The same numbers generate reports for the same tokens. ``lora_request``:
        score with that adapter (loaded from its path first when its name is not)."""
        return [list(s.logprobs)
                for s in self.score_outputs(token_sequences, prompt_lengths,
                                            lora_request=lora_request)]

    def score_outputs(self, token_sequences: Sequence[Sequence[int]],
                      prompt_lengths: Optional[Sequence[int]] = None,
                      top_k: int = 0,
                      lora_request: Optional[LoRARequest] = None) -> List["_core.ScoreOutput"]:
        """``score`` with the details: per sequence a ScoreOutput with ``logprobs``,
        ``ranks`` (1 = most likely) and, with ``top_k`` in 1..20, ``top_logprobs``."""
        seqs = [[int(t) for t in s] for s in token_sequences]
        lengths = [int(n) for n in prompt_lengths] if prompt_lengths is not None else []
        name = self._score_lora(lora_request)
        with self._lock:
            return list(self._core.score(seqs, lengths, int(top_k), name))

    def _score_lora(self, lora_request: Optional[LoRARequest]) -> str:
        """The adapter name score runs with, loading it first when it is not loaded."""
        if lora_request is None:
            return ""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request: expected LoRARequest or None, "
                             f"got {type(lora_request).__name__}")
        if lora_request.lora_name not in {a.name for a in self.list_lora_adapters()}:
            self.load_lora_adapter(lora_request)
        return lora_request.lora_name

    # ---- tokenizer ----------------------------------------------------------------------

    def get_tokenizer(self) -> Tokenizer:
        """The model's tokenizer (raises PagellmError on use when the folder has none)."""
        return Tokenizer(self._core)

    # ---- RL: weights, memory, cache -------------------------------------------------------

    @property
    def weights_version(self) -> int:
        """Version of the weights the next tokens are sampled with; +1 per update."""
        with self._lock:
            return int(self._core.weights_version)

    def update_weights(self, named_tensors: Iterable[Tuple[str, Any]]) -> "_core.WeightUpdateResult":
        """Rewrites weights in place from ``(name, tensor)`` pairs (Hugging Face names, any
        subset). Tensors: torch or any DLPack/buffer-protocol array, on the CPU, in pinned
        memory, or on the engine's GPU; float32, bfloat16 or float16; contiguous (else
        ValueError). Read where they lie, without a copy through Python (torch's pending
        GPU work is waited for first). Atomic: a wrong
        name, shape or dtype raises PagellmError and the old weights keep serving."""
        tensors = _named_tensors(named_tensors)
        with self._lock:
            return self._core.update_weights(tensors)

    def load_weights(self, path: Union[str, os.PathLike]) -> "_core.WeightUpdateResult":
        """The same from a safetensors file or folder."""
        with self._lock:
            return self._core.load_weights(os.fspath(path))

    def pause(self) -> None:
        """Refuses generate/chat until resume(). An LLM runs only inside its own calls, so
        nothing is running to stop; this exists so that RL code written for AsyncLLM
        (pause, update, resume) runs unchanged."""
        self._paused = True

    def resume(self) -> None:
        """Ends pause(); no-op when not paused."""
        self._paused = False

    def sleep(self, level: int = 1) -> "_core.SleepReport":
        """Releases the KV cache's memory (level 1), and with level 2 also offloads the
        weights to host memory, until wake_up(). vLLM's levels."""
        if level not in (1, 2):
            raise ValueError(f"sleep: level must be 1 (KV cache) or 2 (KV cache and weights), got {level}")
        with self._lock:
            return self._core.sleep(level == 2)

    def wake_up(self) -> "_core.WakeReport":
        """Brings back what sleep() released."""
        with self._lock:
            return self._core.wake_up()

    @property
    def is_sleeping(self) -> bool:
        """Between sleep() and wake_up()."""
        with self._lock:
            return bool(self._core.is_sleeping)

    def reset_prefix_cache(self) -> None:
        """Forgets every cached KV page (after a weight update, cached K/V is stale)."""
        with self._lock:
            self._core.reset_prefix_cache()

    def prefix_cache_stats(self) -> "_core.PrefixCacheStats":
        """Prefix cache counters since loading."""
        with self._lock:
            return self._core.prefix_cache_stats()

    # ---- LoRA adapters (docs/design.md, "LoRA") ------------------------------------------

    def load_lora_adapter(self, lora_request: LoRARequest) -> "_core.LoraAdapterInfo":
        """Loads the PEFT folder ``lora_request.lora_path`` under its name into a free
        adapter slot (``max_loras``), or replaces the loaded adapter of that name in place
        (its version goes up). A bad folder raises PagellmError (a ValueError) with the
        core's message, and changes nothing."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"load_lora_adapter: expected LoRARequest, "
                             f"got {type(lora_request).__name__}")
        core = lora_request._to_core()
        with self._lock:
            return self._core.load_lora_adapter(core)

    def unload_lora_adapter(self, lora_name: str) -> None:
        """Unloads an adapter; PagellmError for a name not loaded."""
        with self._lock:
            self._core.unload_lora_adapter(str(lora_name))

    def list_lora_adapters(self) -> List["_core.LoraAdapterInfo"]:
        """The loaded adapters, by name."""
        with self._lock:
            return list(self._core.list_lora_adapters())

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """vLLM's name for :meth:`load_lora_adapter`; True once loaded."""
        self.load_lora_adapter(lora_request)
        return True

    def remove_lora(self, lora_id: Union[int, str]) -> bool:
        """vLLM's remove_lora: unloads the adapter of that ``lora_int_id`` (or name);
        False when none is loaded."""
        for a in self.list_lora_adapters():
            if (a.name == lora_id) if isinstance(lora_id, str) else (a.id == int(lora_id)):
                self.unload_lora_adapter(a.name)
                return True
        return False

    def list_loras(self) -> Set[int]:
        """vLLM's list_loras: the ``lora_int_id`` of every loaded adapter."""
        return {int(a.id) for a in self.list_lora_adapters()}

    # ---- introspection ----------------------------------------------------------------

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output."""
        return int(self._core.max_model_len)

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding."""
        return int(self._core.vocab_size)

    def num_free_pages(self) -> int:
        """KV pages free now (equal to num_usable_pages() when idle)."""
        with self._lock:
            return int(self._core.num_free_pages())

    def num_usable_pages(self) -> int:
        """KV pages in all (page 0, reserved, excluded)."""
        with self._lock:
            return int(self._core.num_usable_pages())


def _progress_bar(use_tqdm: Union[bool, Callable[..., Any]], total: int) -> Any:
    if not use_tqdm:
        return None
    factory = use_tqdm
    if use_tqdm is True:
        try:
            from tqdm.auto import tqdm as factory  # type: ignore[no-redef]
        except ImportError:
            return None
    return factory(total=total, desc="Processed prompts", dynamic_ncols=True)  # type: ignore[operator]
