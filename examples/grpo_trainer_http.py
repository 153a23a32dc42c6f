#!/usr/bin/env python3
"""A worked GRPO trainer over `pagellm serve` (python/pagellm/client.py).

The policy is trained with torch (transformers' Qwen3 on the GPU); rollouts come from a
pagellm server on the same machine. Each step:

  1. rollout: for a batch of prompts, `client.generate(prompt_ids, n=G, ...)` samples a group
     of G completions per prompt and returns each token's log-probability under the weights
     that sampled it (the "old" policy, with its weights version);
  2. reward: a toy verifiable task (two-digit addition; reward 1 when the completion's first
     number is the sum), and group-relative advantages (reward minus the group mean, over
     the group's standard deviation);
  3. update: the clipped GRPO objective on the completions' tokens, the ratio taken against
     the rollout log-probabilities, one optimiser step;
  4. sync: the new weights go to the server without a file, straight from the trainer's
     GPU memory over CUDA IPC (`client.update_model_params(model)`, all at once; the server
     pauses, writes them between two steps and bumps the weights version), or through a
     safetensors folder with --sync path; then `client.reset_prefix_cache()`, so that no
     later prompt reuses KV computed with the old weights (the prefix cache's hashes carry
     the weights version already, so this mostly frees memory).

Run (one GPU, the server started first; a model folder with its tokenizer and chat
template, e.g. a downloaded Qwen3 or `pagellm make-model --preset qwen3-0.6b --out DIR`):
  ./build/pagellm serve --model /models/Qwen3-0.6B --backend cuda --kv-cache-gb 20 &
  python3 examples/grpo_trainer_http.py --model /models/Qwen3-0.6B --steps 20
"""
import argparse
import importlib.util
import os
import random
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("pagellm_client", os.path.join(HERE, "..", "python", "pagellm", "client.py"))
client_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client_module)


def make_prompts(tokenizer, rng, count):
    """Two-digit additions as chat prompts; returns (token ids, answer) pairs."""
    out = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        messages = [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
        out.append((tokenizer(text, add_special_tokens=False)["input_ids"], a + b))
    return out


def reward(text, answer):
    m = re.search(r"-?\d+", text)
    return 1.0 if m and int(m.group()) == answer else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the Hugging Face folder the server serves")
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--sync", choices=["ipc", "path"], default="ipc")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    client = client_module.PagellmClient(args.server, api_key=args.api_key)
    print("server:", client.health())
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng = random.Random(0)

    for step in range(args.steps):
        # 1. rollout: G samples per prompt, with the sampling policy's log-probabilities.
        batch = make_prompts(tokenizer, rng, args.prompts)
        results = client.generate([ids for ids, _ in batch], n=args.group, max_tokens=args.max_tokens,
                                  temperature=1.0, seed=step * 100003)
        sequences, rewards = [], []
        for (ids, answer), result in zip(batch, results):
            group = sorted(result["outputs"], key=lambda o: o["index"])
            for o in group:
                text = tokenizer.decode(o["token_ids"], skip_special_tokens=True)
                sequences.append((ids, o["token_ids"], o["logprobs"]))
                rewards.append(reward(text, answer))
        # 2. group-relative advantages.
        r = torch.tensor(rewards).view(args.prompts, args.group)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)

        # 3. the clipped objective over completion tokens, one sequence at a time.
        model.train()
        optimizer.zero_grad()
        total_tokens = sum(len(c) for _, c, _ in sequences)
        for (prompt, completion, old_lp), a in zip(sequences, adv.tolist()):
            if not completion or a == 0.0:
                continue
            ids = torch.tensor([prompt + completion], device="cuda")
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()  # [completion, vocab]
            new_lp = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt):, None]).squeeze(1)
            ratio = torch.exp(new_lp - torch.tensor(old_lp, device="cuda"))
            loss = -torch.minimum(ratio * a, ratio.clamp(1 - args.clip, 1 + args.clip) * a).sum() / total_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

        # 4. sync the weights to the server, then forget cached prefixes.
        model.eval()
        if args.sync == "ipc":
            report = client.update_model_params(model)
        else:
            folder = tempfile.mkdtemp(prefix="grpo-step-")
            model.save_pretrained(folder, safe_serialization=True)
            report = client.update_weights(folder)
        client.reset_prefix_cache()
        print(f"step {step}: reward {sum(rewards) / len(rewards):.3f}, weights version "
              f"{report['weights_version']} ({report['seconds'] * 1e3:.0f} ms to write)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
