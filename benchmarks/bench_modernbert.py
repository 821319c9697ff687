"""Speed of a converted ModernBERT-base-sized model against its source (random weights), and its FLOP limit.

ModernBERT-base: 22 layers of 12 heads, hidden 768, GLU MLP of 1152, every third layer global and the others
local (a token attends to tokens at distance <= 64, a 128-token window). Prints, measured side by side in one
run (interleaved repeats, median of each), the forward time at n=512 (its usual length) on CPU with sdpa:
source vs fraction 1.0 and 0.5; then the FLOP limits of fraction 1.0 counted from the config.

sdpa on CPU runs a local layer as a dense n x n product with a mask, so there the window saves nothing and
the limit is the dense one; a sliding-window kernel (flash attention) computes only the window, which leaves
PAPA less to remove in local layers.

Run: python benchmarks/bench_modernbert.py [--repeats 3] [--batch 2] [--threads N]
"""

from __future__ import annotations

import argparse
import functools

import torch
from provenance import add_save_option, start_record
from timing import interleaved_medians
from transformers import ModernBertConfig, ModernBertModel

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.surgery import convert


def flops_per_token(config, n: int, constant: bool, keys: int) -> float:
    """Multiply-adds x 2 of one layer per token: projections, MLP and attention over ``keys`` keys."""
    d_model, inner = config.hidden_size, config.intermediate_size
    proj = 2 * d_model * d_model  # one of Q, K, V, O
    mlp = 2 * d_model * 2 * inner + 2 * inner * d_model  # GLU in (2 x inner), out
    if constant:  # V, O, and rownorm(C) @ V over the n keys the constant matrix covers
        return 2 * proj + mlp + 2 * keys * d_model
    return 4 * proj + mlp + 4 * keys * d_model  # Q K^T and A V


def flop_limits(config, n: int) -> dict[str, float]:
    """Source / fraction-1.0 FLOP ratio with dense attention and with a windowed kernel for local layers."""
    window = min(n, 2 * config.sliding_window + 1)
    kinds = config.layer_types
    dense = sum(flops_per_token(config, n, False, n) for _ in kinds) / sum(
        flops_per_token(config, n, True, n) for _ in kinds
    )
    keys = [n if k == "full_attention" else window for k in kinds]
    windowed_src = sum(flops_per_token(config, n, False, k) for k in keys)
    return {
        "dense attention (sdpa on CPU: local layers masked, not skipped)": dense,
        "windowed kernel for the source's local layers, dense constants": windowed_src
        / sum(flops_per_token(config, n, True, n) for _ in kinds),
        "windowed kernel for both (a banded constant product)": windowed_src
        / sum(flops_per_token(config, n, True, k) for k in keys),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_modernbert", args.save)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ModernBertConfig()  # ModernBERT-base
    config._attn_implementation = "sdpa"
    source = ModernBertModel(config).eval()
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    constants = Constants.from_kind("toeplitz", layers, heads, args.length)
    models = {
        "source (sdpa)": source,
        "fraction 1.0": convert(source, constants, [[layer, h] for layer in range(layers) for h in range(heads)]),
        "fraction 0.5": convert(source, constants, [[layer, h] for layer in range(layers) for h in range(heads // 2)]),
    }
    ids = torch.randint(1000, 50000, (args.batch, args.length))
    ids[:, 0], ids[:, -1] = config.cls_token_id, config.sep_token_id
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        medians = interleaved_medians(
            {name: functools.partial(m, input_ids=ids, attention_mask=mask) for name, m in models.items()},
            args.repeats,
        )
    base = medians["source (sdpa)"]
    print(f"forward, batch {args.batch} x n={args.length}, {torch.get_num_threads()} threads, median of {args.repeats}")
    for name, med in medians.items():
        print(f"  {name:16s} {med * 1000:9.1f} ms   speed-up vs source {base / med:5.3f}x")
    print(f"FLOP limit of fraction 1.0 at n={args.length} (source / converted, per token):")
    for name, ratio in flop_limits(config, args.length).items():
        print(f"  {ratio:5.3f}x  {name}")
    record.finish()


if __name__ == "__main__":
    main()
