"""Parity of pagellm's tokenizer with Hugging Face tokenizers and transformers.

    python3 -m tokenizer.parity SUITE   (SUITE: encode, decode, chat, unicode, jinja, small, all)

Runs Hugging Face in this process and pagellm through its command-line tool
(PAGELLM_TOKENIZER_TOOL: pagellm_tokenizer_tool, or `pagellm`), on the deterministic corpus
of tokenizer/corpus.py, and compares:
  encode  token ids of >= 2,000 strings (tokenizers.Tokenizer.encode and transformers'
          tokenizer.encode agree with each other, and pagellm agrees with them), also with
          special tokens split (encode_special_tokens / split_special_tokens)
  decode  text of the ids above and of random id sequences (byte tokens that split UTF-8
          characters, special tokens, ids past the vocabulary), with and without
          skip_special_tokens; the streaming decoder's pieces concatenate to the same text
  chat    apply_chat_template(..., tokenize=False) for >= 50 conversations with tools, tool
          calls and thinking, and the ids of the rendered prompt
  unicode every code point (U+0000..U+10FFFF but surrogates) in contexts that exercise the
          split regex (letters, digits, whitespace, punctuation, contractions) and NFC
          (combining marks before and after, canonical pairs): catches Unicode-version
          differences between Hugging Face's engines and PCRE2/utf8proc
  jinja   apply_chat_template(chat_template=...) for templates that exercise the Jinja
          features in tokenizer/jinja_cases.py (no Qwen3 files needed)
  small   the small tokenizer that make-model writes: loads in tokenizers and transformers,
          and pagellm encodes, decodes and renders like them; write_tokenizer_for_model copies
          the real Qwen3 files when the vocabulary fits
The real Qwen3 tokenizer comes from PAGELLM_QWEN3_TOKENIZER_DIR, else data/qwen3-tokenizer in
the checkout; without it the suites that need it fail. Without tokenizers / transformers
installed the suites exit 77, which ctest reports as skipped.
"""

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

from . import corpus, jinja_cases

SKIP = 77
MAX_REPORTED = 15


def log(*args):
    print(*args, flush=True)


def source_dir():
    return os.environ.get("PAGELLM_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def qwen3_dir():
    env = os.environ.get("PAGELLM_QWEN3_TOKENIZER_DIR")
    candidates = [env] if env else []
    candidates.append(os.path.join(source_dir(), "data", "qwen3-tokenizer"))
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "tokenizer.json")):
            return os.path.abspath(c)
    return None


def require_qwen3():
    d = qwen3_dir()
    if d is None:
        log("FAIL: the Qwen3 tokenizer files were not found: data/qwen3-tokenizer/tokenizer.json belongs "
            f"to the checkout ({source_dir()}); PAGELLM_QWEN3_TOKENIZER_DIR may name another folder.")
        sys.exit(1)
    return d


def require_hf():
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        log(f"SKIP: Hugging Face parity needs `pip install tokenizers transformers jinja2` ({e}).")
        sys.exit(SKIP)


def tool():
    path = os.environ.get("PAGELLM_TOKENIZER_TOOL")
    if not path or not os.path.exists(path):
        log("FAIL: set PAGELLM_TOKENIZER_TOOL to the pagellm_tokenizer_tool (or pagellm) binary "
            "(ctest sets it).")
        sys.exit(1)
    return path


def run_tool(args, lines=None, expect_lines=True):
    """Runs the tool with JSON lines on stdin; returns the parsed output lines."""
    stdin = "".join(json.dumps(line, ensure_ascii=True) + "\n" for line in lines) if lines is not None else ""
    proc = subprocess.run([tool()] + args, input=stdin.encode(), capture_output=True, timeout=600)
    out = proc.stdout.decode("utf-8")
    if not expect_lines:
        return proc.returncode, out, proc.stderr.decode("utf-8", "replace")
    results = [json.loads(line) for line in out.split("\n") if line.strip()]
    if lines is not None and len(results) != len(lines):
        log(f"FAIL: {args[0]} printed {len(results)} lines for {len(lines)} inputs; stderr:\n"
            + proc.stderr.decode("utf-8", "replace"))
        sys.exit(1)
    return results


def load_hf(model_dir):
    import logging
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json")), AutoTokenizer.from_pretrained(model_dir)


def hf_text(case):
    if "text" in case:
        return case["text"]
    return bytes.fromhex(case["hex"]).decode("utf-8", "replace")


def tool_input(case):
    return {"text": case["text"]} if "text" in case else {"text_hex": case["hex"]}


class Report:
    def __init__(self, name):
        self.name = name
        self.checked = 0
        self.failures = []

    def check(self, ok, what):
        self.checked += 1
        if not ok:
            self.failures.append(what)

    def finish(self):
        for f in self.failures[:MAX_REPORTED]:
            log("MISMATCH", f)
        if len(self.failures) > MAX_REPORTED:
            log(f"... and {len(self.failures) - MAX_REPORTED} more")
        status = "PASS" if not self.failures else "FAIL"
        log(f"{status} {self.name}: {self.checked - len(self.failures)}/{self.checked} agree")
        return not self.failures


def short(value, limit=300):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


# ---- suites ------------------------------------------------------------------------

def encode_suite(model_dir, cases, report, split_special=False):
    fast, auto = load_hf(model_dir)
    if split_special:
        fast.encode_special_tokens = True
        from transformers import AutoTokenizer
        auto = AutoTokenizer.from_pretrained(model_dir, split_special_tokens=True)
    args = ["tokenize", "--model", model_dir] + (["--split-special-tokens"] if split_special else [])
    got = run_tool(args, [tool_input(c) for c in cases])
    expected_all = []
    for case, out in zip(cases, got):
        text = hf_text(case)
        expected = fast.encode(text).ids
        via_transformers = auto.encode(text)
        expected_all.append(expected)
        report.check(expected == via_transformers,
                     f"{case['id']}: tokenizers and transformers disagree on {short(text)}")
        if "error" in out:
            report.check(False, f"{case['id']}: pagellm failed: {out['error']}")
            continue
        ids = out["ids"]
        if ids != expected:
            i = first_difference(ids, expected)
            report.check(False, f"{case['id']}{' (split special)' if split_special else ''}: input {short(text)}\n"
                                f"  first difference at token {i}: expected {expected[max(0, i - 3):i + 5]} got {ids[max(0, i - 3):i + 5]}")
        else:
            report.check(True, "")
    return expected_all


def decode_suite(model_dir, id_sequences, labels, report):
    fast, auto = load_hf(model_dir)
    for skip in (False, True):
        args = ["detokenize", "--model", model_dir, "--stream"] + (["--skip-special-tokens"] if skip else [])
        got = run_tool(args, [{"ids": ids} for ids in id_sequences])
        for label, ids, out in zip(labels, id_sequences, got):
            expected = fast.decode(ids, skip_special_tokens=skip)
            report.check(expected == auto.decode(ids, skip_special_tokens=skip),
                         f"{label}: tokenizers and transformers decode differently")
            if "error" in out:
                report.check(False, f"{label}: pagellm failed: {out['error']}")
                continue
            report.check(out["text"] == expected,
                         f"{label} (skip_special_tokens={skip}): ids {short(ids, 200)}\n  expected {short(expected)}\n  got      {short(out['text'])}")
            report.check("".join(out["pieces"]) == out["text"],
                         f"{label}: streamed pieces {short(out['pieces'])} do not add up to {short(out['text'])}")


def chat_kwargs(request):
    kwargs = {k: v for k, v in request.items() if k not in ("messages", "tools", "documents", "add_generation_prompt",
                                                            "continue_final_message", "error")}
    return kwargs


def render_hf(auto, request, chat_template=None, tokenize=False):
    kwargs = chat_kwargs(request)
    try:
        out = auto.apply_chat_template(copy.deepcopy(request["messages"]), tools=copy.deepcopy(request.get("tools")),
                                       documents=request.get("documents"), chat_template=chat_template,
                                       add_generation_prompt=request.get("add_generation_prompt", False),
                                       continue_final_message=request.get("continue_final_message", False),
                                       tokenize=tokenize, **copy.deepcopy(kwargs))
    except Exception as e:  # noqa: BLE001 - any template error counts as "error"
        return None, f"{type(e).__name__}: {e}"
    if tokenize and not isinstance(out, list):
        out = out["input_ids"]
    return out, None


def chat_suite(model_dir, requests, report, check_ids=True):
    _, auto = load_hf(model_dir)
    got = run_tool(["chat-template", "--model", model_dir, "--jsonl"], [{k: v for k, v in r.items() if k != "error"} for r in requests])
    rendered = []
    for i, (request, out) in enumerate(zip(requests, got)):
        expected, error = render_hf(auto, request)
        if error is not None:
            report.check("error" in out, f"chat-{i}: transformers raised {error} but pagellm rendered {short(out.get('text'))}")
            continue
        if "error" in out:
            report.check(False, f"chat-{i}: pagellm failed: {out['error']}\n  request {short(request, 600)}")
            continue
        text = out["text"]
        if text != expected:
            j = first_difference(text, expected)
            report.check(False, f"chat-{i}: rendering differs at char {j}:\n  expected {short(expected[max(0, j - 80):j + 80])}\n"
                                f"  got      {short(text[max(0, j - 80):j + 80])}")
        else:
            report.check(True, "")
        rendered.append((i, request, text))
    if check_ids and rendered:
        ids = run_tool(["tokenize", "--model", model_dir], [{"text": t} for _, _, t in rendered])
        for (i, request, _), out in zip(rendered, ids):
            expected, error = render_hf(auto, request, tokenize=True)
            report.check(error is None and out.get("ids") == expected, f"chat-{i}: prompt ids differ ({error})")


def unicode_probe(cp):
    import unicodedata
    c = chr(cp)
    text = ("a" + c + "a 1" + c + "1 " + c + " ." + c + ". 's" + c + " x'" + c + "ly x'l" + c + " a\u0301" + c
            + " " + c + "\u0323\u0301 \u3000" + c + "\n" + c)
    d = unicodedata.decomposition(c)
    if d and not d.startswith("<"):
        text += " " + "".join(chr(int(x, 16)) for x in d.split())
    return text


def unicode_suite(model_dir, report):
    fast, _ = load_hf(model_dir)
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = [unicode_probe(cp) for cp in cps]
    expected = [e.ids for e in fast.encode_batch(texts)]
    got = run_tool(["tokenize", "--model", model_dir], [{"text": t} for t in texts])
    for cp, text, e, out in zip(cps, texts, expected, got):
        report.check(out.get("ids") == e, f"U+{cp:04X}: {short(text)}\n  expected {e}\n  got      {out.get('ids', out)}")


def jinja_suite(model_dir, report):
    _, auto = load_hf(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        for name, template, extra in jinja_cases.CASES:
            request = {"messages": jinja_cases.MESSAGES}
            request.update(extra)
            expect_error = request.pop("error", False)
            path = os.path.join(tmp, name + ".jinja")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(template)
            expected, error = render_hf(auto, request, chat_template=template)
            got = run_tool(["chat-template", "--model", model_dir, "--template", path, "--jsonl"], [request])[0]
            if error is not None:
                report.check(expect_error and "error" in got,
                             f"jinja {name}: transformers raised {error}; pagellm gave {short(got)}")
                continue
            report.check(not expect_error, f"jinja {name}: expected an error, transformers rendered {short(expected)}")
            if "error" in got:
                report.check(False, f"jinja {name}: pagellm failed: {got['error']}")
            else:
                report.check(got["text"] == expected, f"jinja {name}:\n  expected {short(expected, 2000)}\n  got      {short(got['text'], 2000)}")


def small_suite(report):
    with tempfile.TemporaryDirectory() as tmp:
        small = os.path.join(tmp, "small")
        os.makedirs(small)
        rc, out, err = run_tool(["write-tokenizer", "--dir", small, "--vocab-size", "1024", "--qwen3-dir", ""], expect_lines=False)
        report.check(rc == 0 and out.strip() == "small", f"write-tokenizer (small) failed: {out} {err}")
        with open(os.path.join(small, "tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        max_id = max(list(spec["model"]["vocab"].values()) + [t["id"] for t in spec["added_tokens"]])
        report.check(max_id < 1024, f"small tokenizer id {max_id} does not fit vocab_size 1024")
        cases = corpus.text_corpus()
        ids = encode_suite(small, cases, report)
        decode_suite(small, ids, [c["id"] for c in cases], report)
        chat_suite(small, corpus.chat_corpus()[:30], report)
        # Too small a vocabulary is an error, not a broken file.
        tiny = os.path.join(tmp, "tiny")
        os.makedirs(tiny)
        rc, out, err = run_tool(["write-tokenizer", "--dir", tiny, "--vocab-size", "100", "--qwen3-dir", ""], expect_lines=False)
        report.check(rc != 0 and "vocab_size" in err, f"vocab_size 100 should be rejected with a message, got rc={rc} {err}")
        real = qwen3_dir()
        if real is not None:
            full = os.path.join(tmp, "full")
            os.makedirs(full)
            rc, out, _ = run_tool(["write-tokenizer", "--dir", full, "--vocab-size", "151936", "--qwen3-dir", real], expect_lines=False)
            same = all(open(os.path.join(full, n), "rb").read() == open(os.path.join(real, n), "rb").read()
                       for n in ("tokenizer.json", "tokenizer_config.json"))
            report.check(rc == 0 and out.strip() == "qwen3" and same, "write-tokenizer did not copy the real Qwen3 files for vocab_size 151936")
            narrow = os.path.join(tmp, "narrow")
            os.makedirs(narrow)
            rc, out, _ = run_tool(["write-tokenizer", "--dir", narrow, "--vocab-size", "1024", "--qwen3-dir", real], expect_lines=False)
            report.check(rc == 0 and out.strip() == "small", "write-tokenizer should fall back to the small tokenizer for vocab_size 1024")
        else:
            log("note: Qwen3 files absent; the copy check of write-tokenizer is skipped")


def main(argv):
    suite = argv[1] if len(argv) > 1 else "all"
    if suite not in ("encode", "decode", "chat", "unicode", "jinja", "small", "all"):
        log(__doc__)
        return 2
    require_hf()
    report = Report(suite)
    if suite in ("jinja", "small"):
        if suite == "small":
            small_suite(report)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                rc, out, err = run_tool(["write-tokenizer", "--dir", tmp, "--vocab-size", "1024", "--qwen3-dir", ""], expect_lines=False)
                if rc != 0:
                    log(f"FAIL: write-tokenizer: {err}")
                    return 1
                jinja_suite(tmp, report)
        return 0 if report.finish() else 1
    model_dir = require_qwen3()
    log(f"Qwen3 tokenizer: {model_dir}")
    if suite in ("encode", "all"):
        cases = corpus.text_corpus()
        log(f"encode: {len(cases)} strings")
        encode_suite(model_dir, cases, report)
        special = [c for c in cases if c["id"].startswith(("special", "edge"))]
        encode_suite(model_dir, special, report, split_special=True)
    if suite in ("decode", "all"):
        cases = corpus.text_corpus()
        fast, _ = load_hf(model_dir)
        sequences = [fast.encode(hf_text(c)).ids for c in cases]
        labels = [c["id"] for c in cases]
        special_ids = sorted(fast.get_added_tokens_decoder().keys())
        random_sequences = corpus.random_id_sequences(151936, special_ids)
        sequences += random_sequences
        labels += [f"random-{i}" for i in range(len(random_sequences))]
        log(f"decode: {len(sequences)} id sequences")
        decode_suite(model_dir, sequences, labels, report)
    if suite in ("unicode", "all"):
        log("unicode: every code point")
        unicode_suite(model_dir, report)
    if suite in ("chat", "all"):
        requests = corpus.chat_corpus()
        log(f"chat: {len(requests)} conversations")
        chat_suite(model_dir, requests, report)
    return 0 if report.finish() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
