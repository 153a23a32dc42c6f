"""HTTP client for `pagellm serve`: token-level generation, chat, and the control calls an
RL trainer makes between steps (pause/resume, weight updates, prefix-cache reset,
sleep/wake). Standard library only; torch is imported lazily, for CUDA IPC weight updates.

    from pagellm.client import PagellmClient
    c = PagellmClient("http://127.0.0.1:8000")
    out = c.generate([[1, 2, 3]], max_tokens=16, temperature=1.0, logprobs=0)
    c.update_weights(path="/ckpt/step-10")   # or c.update_model_params(model) over CUDA IPC
    c.reset_prefix_cache()
"""
from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

__all__ = ["PagellmClient", "PagellmError"]


class PagellmError(RuntimeError):
    """An error answered by the server: HTTP status, message and the request field named."""

    def __init__(self, status: int, message: str, param: Optional[str] = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.param = param


class PagellmClient:
    """One server. Each call opens its own connection, so an instance may be shared by threads.

    base_url: "http://host:port"; api_key: the server's --api-key, if set; timeout: seconds
    per call (generation and blocking control calls such as pause(mode="wait") included).
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: Optional[str] = None,
                 timeout: float = 3600.0):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base_url must be http://host:port, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.api_key = api_key
        self.timeout = timeout

    # ---- transport ----------------------------------------------------------------
    def _request(self, method: str, path: str, body: Optional[dict] = None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status >= 400:
            text = resp.read().decode("utf-8", "replace")
            conn.close()
            try:
                err = json.loads(text)["error"]
                raise PagellmError(resp.status, err.get("message", text), err.get("param"))
            except (ValueError, KeyError, TypeError):
                raise PagellmError(resp.status, text) from None
        return conn, resp

    def _call(self, method: str, path: str, body: Optional[dict] = None) -> Any:
        conn, resp = self._request(method, path, body)
        try:
            text = resp.read().decode("utf-8")
        finally:
            conn.close()
        ctype = resp.getheader("Content-Type", "")
        return json.loads(text) if ctype.startswith("application/json") else text

    def _stream(self, path: str, body: dict) -> Iterator[dict]:
        conn, resp = self._request("POST", path, body)
        try:
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    return
                yield json.loads(data)
        finally:
            conn.close()  # leaving early closes the socket: the server aborts the request

    # ---- generation -----------------------------------------------------------------
    @staticmethod
    def _sampling(kw: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in kw.items() if v is not None}

    def generate(self, prompt_token_ids: Union[Sequence[int], Sequence[Sequence[int]]],
                 **sampling: Any) -> Union[dict, List[dict]]:
        """Token ids in, the engine's outputs back (per sample: token_ids, logprobs,
        processed_logprobs with processed_logprobs=True, top_logprobs with logprobs=k,
        weights_versions, finish_reason). sampling: n, max_tokens, temperature, top_p, top_k,
        min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, stop_token_ids,
        ignore_eos, logprobs, processed_logprobs. A list of prompts gives a list of results."""
        batched = len(prompt_token_ids) > 0 and not isinstance(prompt_token_ids[0], int)
        prompts = prompt_token_ids if batched else [prompt_token_ids]
        params = self._sampling(sampling)

        def one(p):
            return self._call("POST", "/generate", {"prompt_token_ids": list(p), "sampling_params": params})

        if len(prompts) == 1:
            results = [one(prompts[0])]
        else:
            # One request per prompt, all in flight at once, so the engine batches them.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(len(prompts), 256)) as pool:
                results = list(pool.map(one, prompts))
        return results if batched else results[0]

    def generate_stream(self, prompt_token_ids: Sequence[int], **sampling: Any) -> Iterator[dict]:
        """Streamed /generate: yields deltas (the same fields, new tokens only)."""
        return self._stream("/generate", {"prompt_token_ids": list(prompt_token_ids), "stream": True,
                                          "sampling_params": self._sampling(sampling)})

    def chat(self, messages: List[dict], **params: Any) -> dict:
        """POST /v1/chat/completions; returns the OpenAI response as a dict. params: the OpenAI
        fields (max_tokens, temperature, n, seed, logprobs, top_logprobs, ...) plus
        chat_template_kwargs, return_token_ids."""
        return self._call("POST", "/v1/chat/completions", {"messages": messages, **params})

    def complete(self, prompt: Union[str, List[int], List[str], List[List[int]]], **params: Any) -> dict:
        """POST /v1/completions; returns the OpenAI response as a dict."""
        return self._call("POST", "/v1/completions", {"prompt": prompt, **params})

    def tokenize(self, prompt: Optional[str] = None, messages: Optional[List[dict]] = None,
                 **params: Any) -> List[int]:
        """POST /tokenize: the token ids the server runs for a prompt text, or for a chat
        (``messages`` with params tools, add_generation_prompt, continue_final_message,
        chat_template_kwargs), e.g. to build a multi-turn rollout's ids on the trainer's
        side exactly as the server's chat template makes them."""
        body: dict = {"prompt": prompt} if messages is None else {"messages": messages}
        return self._call("POST", "/tokenize", {**body, **params})["tokens"]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """POST /detokenize: the text of token ids (special tokens kept)."""
        return self._call("POST", "/detokenize", {"tokens": [int(t) for t in token_ids]})["prompt"]

    # ---- control ----------------------------------------------------------------------
    def models(self) -> dict:
        """GET /v1/models: the served model (with its max_model_len and
        tensor_parallel_size) and the loaded LoRA adapters."""
        return self._call("GET", "/v1/models")

    def health(self) -> dict:
        """Load and state: running, waiting, free_pages, usable_pages, paused, asleep,
        weights_version."""
        return self._call("GET", "/health")

    def metrics(self) -> str:
        """The Prometheus text of GET /metrics."""
        return self._call("GET", "/metrics")

    def pause(self, mode: str = "wait") -> dict:
        """mode: "wait" (running requests finish first), "abort" or "keep" (frozen in place)."""
        return self._call("POST", "/pause", {"mode": mode})

    def resume(self) -> dict:
        return self._call("POST", "/resume")

    def reset_prefix_cache(self) -> dict:
        return self._call("POST", "/reset_prefix_cache")

    def sleep(self, offload_weights: bool = False) -> dict:
        return self._call("POST", "/sleep", {"offload_weights": offload_weights})

    def wake_up(self) -> dict:
        return self._call("POST", "/wake_up")

    def update_weights(self, path: str, mode: str = "wait") -> dict:
        """Loads weights from a safetensors folder or file the server can read; returns the
        update's report (weights_version, tensors_updated, seconds, ...)."""
        return self._call("POST", "/update_weights", {"path": path, "mode": mode})

    # ---- weights broadcast from a trainer (pagellm.weight_broadcast drives these) ---------
    def init_weights_group(self, backend: str = "nccl", unique_id: Optional[bytes] = None,
                           master_address: Optional[str] = None, master_port: Optional[int] = None,
                           rank_offset: int = 1, world_size: Optional[int] = None, group_name: str = "",
                           timeout_seconds: Optional[float] = None) -> dict:
        """Has the server join the trainer's weight group: ``backend`` "nccl" with the 128
        bytes of ncclGetUniqueId, or "tcp" with the address where the trainer listens. Blocks
        until the server has joined, so the trainer must be joining (or accepting) meanwhile.
        A server of N tensor-parallel ranks joins as ranks rank_offset .. rank_offset + N - 1;
        world_size (default: rank_offset + N) counts the trainer and all of them."""
        body: Dict[str, Any] = {"backend": backend, "rank_offset": rank_offset, "group_name": group_name}
        if world_size is not None:
            body["world_size"] = world_size
        if unique_id is not None:
            body["unique_id"] = base64.b64encode(bytes(unique_id)).decode()
        if master_address is not None:
            body["master_address"] = master_address
        if master_port is not None:
            body["master_port"] = master_port
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        return self._call("POST", "/init_weights_group", body)

    def destroy_weights_group(self) -> dict:
        return self._call("POST", "/destroy_weights_group")

    def update_weights_from_broadcast(self, tensors: Sequence[dict], bucket_bytes: int,
                                      mode: str = "wait", group_name: str = "") -> dict:
        """Tells the server to receive an update from the joined group: ``tensors`` are
        {"name", "dtype", "shape"} in the order the trainer packs them into buckets of
        ``bucket_bytes``. Blocks until the server has received and written them, so the
        trainer broadcasts meanwhile (pagellm.weight_broadcast.WeightBroadcaster does both)."""
        body = {"broadcast": {"tensors": list(tensors), "bucket_bytes": int(bucket_bytes),
                              "group_name": group_name}, "mode": mode}
        return self._call("POST", "/update_weights", body)

    # ---- weights from a colocated trainer over CUDA IPC ----------------------------------
    @staticmethod
    def raw_cuda_ipc_handle(handle: bytes) -> bytes:
        """The 64-byte cudaIpcMemHandle_t inside the handle torch's ``_share_cuda_`` gives.
        torch >= 2.5 writes a version byte and a type byte before it ('c': a cudaMalloc
        block, followed by the 64 bytes; 'e': an expandable segment, which has no
        cudaIpcMemHandle_t); older torch gives the 64 bytes alone."""
        handle = bytes(handle)
        if len(handle) == 64:
            return handle
        if len(handle) >= 2 and handle[1:2] == b"e":
            raise ValueError("the tensor lives in an expandable segment, which CUDA IPC handles "
                             "cannot share: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False "
                             "in the trainer")
        if len(handle) == 66 and handle[1:2] == b"c":
            return handle[2:]
        raise ValueError(f"unrecognised CUDA IPC handle from torch ({len(handle)} bytes; expected 64, "
                         "or 66 with a version and a 'c' type byte)")

    @staticmethod
    def ipc_descriptor(name: str, tensor: Any) -> dict:
        """The JSON description of one CUDA tensor for an IPC update: the 64-byte
        cudaIpcMemHandle_t of its storage's allocation (base64), the byte offset of the
        tensor's first element in it, dtype and shape. The tensor must be contiguous and must
        stay alive (unchanged) until the update returns."""
        import torch  # lazily: only this path needs it

        if not tensor.is_cuda:
            raise ValueError(f"{name}: an IPC update needs a CUDA tensor, got device {tensor.device}")
        if not tensor.is_contiguous():
            raise ValueError(f"{name}: an IPC update needs a contiguous tensor (call .contiguous())")
        dtypes = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
        if tensor.dtype not in dtypes:
            raise ValueError(f"{name}: dtype {tensor.dtype} is not a weight dtype (bfloat16, float16, float32)")
        storage = tensor.untyped_storage()
        # (device, handle, storage bytes, storage offset in its allocation, ref-counter
        # handle and offset, event handle, event sync required): the handle names the whole
        # caching-allocator block, so the offsets locate the tensor inside it.
        shared = storage._share_cuda_()
        device, handle, _, storage_offset = shared[0], shared[1], shared[2], shared[3]
        return {"name": name,
                "handle": base64.b64encode(PagellmClient.raw_cuda_ipc_handle(handle)).decode(),
                "device": int(device),
                "offset": int(storage_offset) + tensor.storage_offset() * tensor.element_size(),
                "dtype": dtypes[tensor.dtype],
                "shape": list(tensor.shape)}

    def update_weights_from_tensors(self, named_tensors: Iterable[Tuple[str, Any]],
                                    mode: str = "wait") -> dict:
        """Updates the named tensors at once from this process's CUDA memory (same machine,
        same GPU): the server opens the handles, copies, and closes them before answering."""
        import torch

        tensors = [(n, t.detach()) for n, t in named_tensors]
        torch.cuda.synchronize()  # the server reads the memory from another process
        body = {"ipc_tensors": [self.ipc_descriptor(n, t) for n, t in tensors], "mode": mode}
        return self._call("POST", "/update_weights", body)

    def update_named_param(self, name: str, tensor: Any, mode: str = "wait") -> dict:
        """TRL's name: one parameter by its Hugging Face name."""
        return self.update_weights_from_tensors([(name, tensor)], mode)

    def update_model_params(self, model: Any, mode: str = "wait") -> dict:
        """TRL's name: every parameter of a torch module (named_parameters()), in one update."""
        return self.update_weights_from_tensors(list(model.named_parameters()), mode)
