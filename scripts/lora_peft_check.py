#!/usr/bin/env python3
"""pagellm's LoRA against transformers + PEFT (issue 19), on the GPU machine.

A random-weight Qwen3 folder as transformers writes it (tests/oracles/model/
save_pretrained_reference.py; default preset qwen3-0.6b) and two random rank-32 adapters
on all seven modules with B non-zero, written by `pagellm make-lora` in PEFT's layout
(adapter "a" lists the seven modules, adapter "b" says "all-linear"). The reference is
PeftModel.from_pretrained over the base model in float32; every factor PEFT loaded is
checked against the file first (PEFT ignores names it does not know, which would leave B at
zero and make the check vacuous). Two comparisons, each with the base model's own rule:

1. Logits, with the rule of the end-to-end test (tests/oracles/e2e/compare_hf.py): per
   adapter, `pagellm generate --lora NAME=DIR --dump-logits` (greedy, EOS ignored) over
   prompts of several lengths; transformers + PEFT scores the exact sequence pagellm
   generated (teacher-forced), and each logits row (the prefill's and every decode step's)
   is compared by relative L2 error against float32. Bound: min(0.1, 2 x the error of
   transformers + PEFT in bf16 against float32 + 0.01).
2. Per-token log-probabilities in one mixed batch, with the rule of the logprob test
   (tests/oracles/logprobs/compare_logprobs.py): one `pagellm.LLM.generate` call in which
   the prompts run with adapter a, adapter b and no adapter, interleaved; each generated
   token's log-probability, and each prompt token's (prompt_logprobs), against its own
   reference (PEFT with that adapter, or the base model), teacher-forced in float32. Bound
   per group: p99 |delta| <= 2 x the p99 of transformers + PEFT in bf16 + 0.01. Each
   adapter group also prints its distance from the base model's values, so a part that ran
   without the adapter says so (prompt_logprobs come from Engine::score, which runs the
   base model until it takes an adapter: docs/design.md, "LoRA", "Not done yet").

Exits non-zero when any comparison fails (or PEFT did not load the factors); the summary
lists each. The pagellm half runs anywhere (`--backend cpu --preset tiny --device cpu` on a
machine with torch); the GPU suite's "lora" step runs it with the cuda backend.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracles"))
from logits_dump import read_dump  # noqa: E402  (generate --dump-logits records)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(" ".join(cmd))
        print(res.stdout[-4000:], res.stderr[-4000:])
        sys.exit(f"FAIL: {os.path.basename(cmd[0])} {cmd[1]} failed")
    return res.stdout


def make_inputs(args, work):
    """The model folder (made unless given) and the two adapter folders."""
    model = args.model or os.path.join(work, f"model-{args.preset}")
    if not os.path.exists(os.path.join(model, "config.json")):
        run([sys.executable, os.path.join(ROOT, "tests/oracles/model/save_pretrained_reference.py"),
             "--preset", args.preset, "--out", model, "--seed", str(args.seed), "--dtype", "bf16"])
    adapters = {}
    for name, seed, targets in (("a", args.seed + 1, ",".join(MODULES)),
                                ("b", args.seed + 2, "all-linear")):
        path = os.path.join(work, f"adapter-{name}")
        run([args.pagellm, "make-lora", "--model", model, "--out", path, "--rank", str(args.rank),
             "--alpha", str(2 * args.rank), "--targets", targets, "--seed", str(seed)])
        adapters[name] = path
    return model, adapters


class Reference:
    """transformers + PEFT with both adapters, in one dtype; `logits(seq, adapter)` with
    adapter None for the base model."""

    def __init__(self, torch, model_dir, adapters, dtype, device):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.device = device
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        names = list(adapters)
        self.model = PeftModel.from_pretrained(base, adapters[names[0]], adapter_name=names[0])
        for n in names[1:]:
            self.model.load_adapter(adapters[n], adapter_name=n)
        self.model.eval()

    def check_factors(self, adapters):
        """Every lora_A / lora_B PEFT holds equals the file's tensor, and none is missing:
        returns a list of problems (empty when all match)."""
        from safetensors.numpy import load_file

        state = {k: v for k, v in self.model.state_dict().items() if ".lora_" in k}
        problems = []
        for name, path in adapters.items():
            tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
            held = {k: v for k, v in state.items() if f".{name}.weight" in k}
            if len(held) != len(tensors):
                problems.append(f"adapter {name}: PEFT holds {len(held)} factors, the file "
                                f"{len(tensors)}")
            for key, want in tensors.items():
                peft_key = key.replace(".weight", f".{name}.weight")
                if peft_key not in held:
                    problems.append(f"adapter {name}: PEFT did not load {key}")
                    continue
                got = held[peft_key].float().cpu().numpy()
                if got.shape != want.shape or not np.allclose(got, want.astype(np.float32),
                                                              rtol=1e-2, atol=1e-6):
                    problems.append(f"adapter {name}: {key} differs from the file")
            if not any(np.abs(t).max() > 0 for k, t in tensors.items() if "lora_B" in k):
                problems.append(f"adapter {name}: every B is zero (the check would be vacuous)")
        return problems

    def logits(self, seq, adapter):
        torch = self.torch
        ids = torch.tensor([seq], device=self.device)
        with torch.no_grad():
            if adapter is None:
                with self.model.disable_adapter():
                    out = self.model(input_ids=ids).logits[0]
            else:
                self.model.set_adapter(adapter)
                out = self.model(input_ids=ids).logits[0]
        return out.float().cpu().numpy()


def log_softmax(rows):
    rows = rows.astype(np.float64)
    m = rows.max(axis=-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))


def pagellm_cli(args, model, adapters, prompts):
    """Per adapter: `pagellm generate --lora NAME=DIR --dump-logits` over every prompt
    (greedy, EOS ignored): {name: (token lists, {(request, step): logits row})}."""
    runs = {}
    for name, path in adapters.items():
        dump = os.path.join(args.workdir, f"logits-{name}.bin")
        cmd = [args.pagellm, "generate", "--model", model, "--backend", args.backend,
               "--lora", f"{name}={path}", "--max-tokens", str(args.tokens), "--temperature", "0",
               "--ignore-eos", "--json", "--dump-logits", dump]
        for p in prompts:
            cmd += ["--prompt-ids", ",".join(map(str, p))]
        outs = [json.loads(l) for l in run(cmd).splitlines() if l.startswith("{")]
        assert len(outs) == len(prompts), f"{len(outs)} outputs for {len(prompts)} prompts"
        runs[name] = ([o["token_ids"] for o in outs], read_dump(dump))
    return runs


def pagellm_mixed(args, model, adapters, prompts):
    """One LLM.generate call, prompt i with adapter a, b or none in turn (greedy, EOS
    ignored, logprobs and prompt_logprobs): per prompt (adapter or None, tokens, generated
    tokens' logprobs, prompt tokens' logprobs from the second token on)."""
    import pagellm

    llm = pagellm.LLM(model, backend=args.backend, kv_cache_gb=args.kv_cache_gb)
    requests = {n: pagellm.LoRARequest(n, i + 1, p) for i, (n, p) in enumerate(adapters.items())}
    cycle = list(adapters) + [None]
    which = [cycle[i % len(cycle)] for i in range(len(prompts))]
    params = pagellm.SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True,
                                    logprobs=0, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                        lora_request=[requests[w] if w else None for w in which])
    rows = []
    for prompt, out, name in zip(prompts, outs, which):
        comp = out.outputs[0]
        assert comp.finish_reason == "length", f"a mixed-batch request ended with {comp.finish_reason}"
        prompt_lp = [float(d[t].logprob) for d, t in zip(out.prompt_logprobs[1:], prompt[1:])]
        rows.append((name, list(comp.token_ids), [float(x) for x in comp.token_logprobs], prompt_lp))
    return rows


def check_logits(args, prompts, cli, ref32, ref16):
    """Part 1: the CLI's logits rows per adapter against PEFT in float32 (compare_hf's rule)."""
    results = []
    for name, (tokens, rows) in cli.items():
        worst = worst_hf = 0.0
        least_moved = float("inf")  # how far the adapter moves a row: must exceed the error
        for r, prompt in enumerate(prompts):
            seq = prompt + tokens[r]
            want = ref32.logits(seq, name)
            hf16 = ref16.logits(seq, name)
            base = ref32.logits(seq, None)
            for i in range(args.tokens):
                pos = len(prompt) - 1 + i
                got = rows[(r, i)]
                if not np.isfinite(got).all():
                    sys.exit(f"FAIL: adapter {name}, request {r}, step {i}: non-finite logits")
                norm = np.linalg.norm(want[pos])
                worst = max(worst, float(np.linalg.norm(got - want[pos]) / norm))
                worst_hf = max(worst_hf, float(np.linalg.norm(hf16[pos] - want[pos]) / norm))
                least_moved = min(least_moved, float(np.linalg.norm(base[pos] - want[pos]) / norm))
        bound = min(0.1, 2.0 * worst_hf + 0.01)
        results.append((f"logits, adapter {name} (CLI --lora, {len(prompts)} prompts x "
                        f"{args.tokens} rows)", worst <= bound and least_moved > worst,
                        f"worst relative L2 {worst:.3e}; transformers+PEFT bf16 {worst_hf:.3e}; "
                        f"bound {bound:.3e}; the adapter moves every row by >= {least_moved:.3e}"))
    return results


def check_mixed(prompts, mixed, ref32, ref16):
    """Part 2: the mixed batch's logprobs, each prompt against its own reference
    (compare_logprobs's rule), per adapter and per part (prompt / generated tokens)."""
    groups = {}  # (adapter, part) -> |delta| of pagellm, of PEFT bf16, and pagellm vs the base
    for prompt, (name, tokens, gen_lp, prompt_lp) in zip(prompts, mixed):
        seq = prompt + tokens
        targets = np.arange(len(seq) - 1), np.asarray(seq[1:])
        want = log_softmax(ref32.logits(seq, name))[targets]
        hf16 = log_softmax(ref16.logits(seq, name))[targets]
        base = log_softmax(ref32.logits(seq, None))[targets] if name else want
        n = len(prompt) - 1
        for part, got, sl in (("prompt", prompt_lp, slice(0, n)),
                              ("generated", gen_lp, slice(n, len(seq) - 1))):
            g = groups.setdefault((name or "none", part), ([], [], []))
            g[0].extend(np.abs(np.asarray(got) - want[sl]).tolist())
            g[1].extend(np.abs(hf16[sl] - want[sl]).tolist())
            g[2].extend(np.abs(np.asarray(got) - base[sl]).tolist())
    results = []
    for (label, part), (ours, theirs, vs_base) in sorted(groups.items()):
        p99 = float(np.percentile(ours, 99))
        hf_p99 = float(np.percentile(theirs, 99))
        bound = 2.0 * hf_p99 + 0.01
        detail = (f"p99 |delta| {p99:.3e} (mean {np.mean(ours):.3e}); transformers+PEFT bf16 "
                  f"p99 {hf_p99:.3e}; bound {bound:.3e}")
        if label != "none":
            base_p99 = float(np.percentile(vs_base, 99))
            detail += f"; against the base model instead: p99 {base_p99:.3e}"
            if p99 > bound and base_p99 <= bound:
                detail += (" -- these are the base model's values: pagellm ran this part "
                           "without the adapter")
        results.append((f"logprobs, mixed batch, adapter {label}, {part} tokens ({len(ours)})",
                        p99 <= bound, detail))
    return results


def check_self_consistency(prompts, cli, mixed, tol):
    """Without a reference: the mixed batch's rows with an adapter against the CLI's run of
    that adapter alone (the same greedy tokens; each token's logprob from the dumped logits
    within tol). On the CPU backend (float32, a row's result independent of its batch) they
    agree to rounding; on CUDA batch composition changes bf16 rounding, so there it is only
    printed."""
    worst = 0.0
    same_tokens = True
    for r, (prompt, (name, tokens, gen_lp, _)) in enumerate(zip(prompts, mixed)):
        if name is None:
            continue
        cli_tokens, rows = cli[name]
        same_tokens &= cli_tokens[r] == tokens
        for i, t in enumerate(cli_tokens[r][:len(gen_lp)]):
            worst = max(worst, abs(float(log_softmax(rows[(r, i)][None, :])[0, t]) - gen_lp[i]))
    return [("mixed batch against each adapter run alone (CLI)", same_tokens and worst <= tol,
             f"greedy tokens {'equal' if same_tokens else 'DIFFER'}; worst |delta logprob| "
             f"{worst:.3e} (tolerance {tol:g})")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a Qwen3 folder as transformers writes it (default: made "
                    "with save_pretrained_reference.py --preset PRESET in the work folder)")
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--pagellm", default="build/pagellm", help="the CLI (make-lora, generate)")
    ap.add_argument("--backend", default="cuda", help="pagellm's backend: cuda or cpu")
    ap.add_argument("--device", default="cuda", help="torch's device for the reference")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt")
    ap.add_argument("--lengths", default="5,37,128,300,17,64",
                    help="prompt lengths (the mixed batch cycles a, b, none over them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-cache-gb", type=float, default=2.0)
    ap.add_argument("--workdir", help="where the model and adapters go (default: a temp folder)")
    ap.add_argument("--pagellm-only", action="store_true",
                    help="no transformers/PEFT: run pagellm's half and check the mixed batch "
                    "against each adapter alone (for machines without torch; needs --model, "
                    "e.g. from `pagellm make-model`)")
    args = ap.parse_args()
    if args.pagellm_only and not args.model:
        ap.error("--pagellm-only needs --model (save_pretrained_reference.py needs torch)")

    args.workdir = args.workdir or tempfile.mkdtemp(prefix="lora-peft-check-")
    os.makedirs(args.workdir, exist_ok=True)
    model, adapters = make_inputs(args, args.workdir)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, vocab, size=int(n)).tolist() for n in args.lengths.split(",")]

    cli = pagellm_cli(args, model, adapters, prompts)
    mixed = pagellm_mixed(args, model, adapters, prompts)
    consistency = check_self_consistency(prompts, cli, mixed, tol=2e-3)
    if args.pagellm_only:
        results = consistency
    else:
        import torch

        ref32 = Reference(torch, model, adapters, torch.float32, args.device)
        problems = ref32.check_factors(adapters)
        if problems:
            print("\n".join(problems[:20]))
            sys.exit("FAIL: PEFT did not load the adapters pagellm wrote as they are")
        ref16 = Reference(torch, model, adapters, torch.bfloat16, args.device)
        results = check_logits(args, prompts, cli, ref32, ref16)
        results += check_mixed(prompts, mixed, ref32, ref16)
        if args.backend != "cpu":  # CUDA: batch composition changes bf16 rounding
            results += [(w, True, d + " [printed, not checked on cuda]") for w, _, d in consistency]
        else:
            results += consistency
    print(f"LoRA against transformers + PEFT: {model}, rank {args.rank} on all seven modules, "
          f"pagellm backend {args.backend}, prompts of {args.lengths} tokens, {args.tokens} "
          f"greedy tokens each{' (pagellm only, no reference)' if args.pagellm_only else ''}")
    for what, ok, detail in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {what}: {detail}")
    failed = [what for what, ok, _ in results if not ok]
    if failed:
        sys.exit(f"FAIL: {len(failed)} of {len(results)} comparisons")
    print(f"PASS: {len(results)} comparisons")


if __name__ == "__main__":
    main()
