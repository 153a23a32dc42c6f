"""A deliberate race through the extension, for tests/python/tsan.cmake: it must be reported.

The C++ LLM is used by one thread at a time (include/pagellm/llm.h); pagellm.LLM serialises
its calls with a lock. This script goes around that lock: one thread runs the core's
generate (the GIL released, no step callback, so it never takes the GIL back) while the
main thread reads the free page count the engine is changing. Under ThreadSanitizer with
the module instrumented and the runtime preloaded, that read races the engine's writes; a
run that reports nothing proves the set-up blind, not the package clean.

Usage: tsan_self_check.py MODEL_DIR (PYTHONPATH naming the instrumented package)."""
import sys
import threading

from pagellm import _core


def main() -> None:
    options = _core.EngineOptions()
    options.backend = "cpu"
    options.kv_cache_bytes = 20 << 20
    core = _core.LLM(sys.argv[1], options)
    params = _core.SamplingParams()
    params.max_tokens = 48
    params.ignore_eos = True
    prompts = [_core.Prompt.from_token_ids([3 + i, 5, 8]) for i in range(8)]
    worker = threading.Thread(target=core.generate, args=(prompts, [params], []))
    worker.start()
    reads = 0
    while worker.is_alive():
        core.num_free_pages()
        reads += 1
    worker.join()
    print(f"no report after {reads} reads racing generate", file=sys.stderr)


if __name__ == "__main__":
    main()
