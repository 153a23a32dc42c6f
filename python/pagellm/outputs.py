"""RequestOutput, CompletionOutput and Logprob: what generate returns, vLLM's shapes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from . import _core


@dataclass
class Logprob:
    """One token's log-probability (natural log, raw distribution), its rank among the
    vocabulary (1 = most likely; None when not computed) and its text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


#: Per position: token id -> Logprob (vLLM's ``SampleLogprobs`` entry).
LogprobDict = Dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One sample of a request (vLLM's ``CompletionOutput``).

    ``logprobs`` is None unless ``SamplingParams.logprobs`` was set; then one
    ``{token_id: Logprob}`` dict per output token. ``token_logprobs`` always holds each
    sampled token's raw log-probability (the engine's flat list). ``finish_reason`` is
    vLLM's coarse name ("stop", "length", "abort", "error"; None while running);
    ``stop_reason`` is the stop string or stop token id that ended it (None otherwise).
    ``finish_detail`` is pagellm's fine name ("eos", "stop", "stop_string", ...).
    """

    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[LogprobDict]]
    finish_reason: Optional[str] = None
    stop_reason: Optional[object] = None
    token_logprobs: List[float] = field(default_factory=list)
    finish_detail: str = "none"
    weights_versions: List[int] = field(default_factory=list)
    error: str = ""

    def finished(self) -> bool:
        """Whether this sample has ended."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The result of one prompt (vLLM's ``RequestOutput``): ``outputs[j]`` for its n
    samples. From ``AsyncLLM.generate`` each yielded output is cumulative (everything so
    far), as vLLM's default output kind is."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    prompt_logprobs: Optional[List[Optional[LogprobDict]]] = None
    weights_version: int = 0


def prompt_logprobs_from_score(ids: List[int], scored: Optional["_core.ScoreOutput"], k: int,
                               decode: Callable[[int], str]) -> List[Optional[LogprobDict]]:
    """vLLM's ``prompt_logprobs`` from a score of the prompt (prompt length 1): None for the
    first token (nothing precedes it), then per token its own Logprob plus, with k > 0,
    the k most likely tokens of that position. ``scored`` is None for a one-token prompt."""
    result: List[Optional[LogprobDict]] = [None]
    if scored is None:
        return result
    for pos, token in enumerate(ids[1:]):
        entry: LogprobDict = {}
        if k > 0:
            for rank, alt in enumerate(scored.top_logprobs[pos], start=1):
                entry[int(alt.token_id)] = Logprob(float(alt.logprob), rank, decode(alt.token_id))
        entry[int(token)] = Logprob(float(scored.logprobs[pos]), int(scored.ranks[pos]),
                                    decode(token))
        result.append(entry)
    return result


def _stop_reason(core: "_core.CompletionOutput", params: "_core.SamplingParams",
                 decode_ids: Callable[[List[int]], str]) -> Optional[object]:
    detail = core.finish_reason
    if detail == "stop" and core.token_ids:
        return int(core.token_ids[-1])
    if detail == "stop_string":
        # The text is cut before the stop string: the one that follows the cut in the full
        # decode of the tokens is the one that fired.
        full = decode_ids(list(core.token_ids))
        for s in params.stop:
            if full.startswith(s, len(core.text)):
                return s
        return next((s for s in params.stop if s in full), None)
    return None


def _logprob_dicts(core: "_core.CompletionOutput", k: Optional[int],
                   decode: Callable[[int], str]) -> Optional[List[LogprobDict]]:
    if k is None:
        return None
    dicts: List[LogprobDict] = []
    for i, token in enumerate(core.token_ids):
        entry: LogprobDict = {}
        if k > 0 and i < len(core.top_logprobs):
            for rank, alt in enumerate(core.top_logprobs[i], start=1):
                entry[int(alt.token_id)] = Logprob(float(alt.logprob), rank, decode(alt.token_id))
        rank = int(core.logprob_ranks[i]) if i < len(core.logprob_ranks) else None
        entry[int(token)] = Logprob(float(core.logprobs[i]), rank, decode(token))
        dicts.append(entry)
    return dicts


def convert_completion(core: "_core.CompletionOutput", params: "_core.SamplingParams",
                       logprobs_k: Optional[int], decode: Callable[[int], str],
                       decode_ids: Callable[[List[int]], str]) -> CompletionOutput:
    """The Python CompletionOutput of a C++ one (a whole output, not a delta)."""
    reason = core.finish_reason_openai or None
    return CompletionOutput(
        index=int(core.index),
        text=core.text,
        token_ids=list(core.token_ids),
        cumulative_logprob=float(core.cumulative_logprob),
        logprobs=_logprob_dicts(core, logprobs_k, decode),
        finish_reason=reason,
        stop_reason=_stop_reason(core, params, decode_ids),
        token_logprobs=list(core.logprobs),
        finish_detail=core.finish_reason,
        weights_versions=list(core.weights_versions),
        error=core.error,
    )
