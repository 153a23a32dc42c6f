"""Qwen3-4B's config.json for the transformers peers, written out so that no download is
needed (the GPU machine has no network)."""
from transformers import AutoConfig


def qwen3_4b_config():
    return AutoConfig.for_model(
        "qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        max_position_embeddings=40960)
