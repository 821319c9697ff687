"""Long inputs: a converted ModernBERT-base against its source at n = 512, 2,048 and 8,192 (issue 21).

Sections (``--sections``), side by side in one run:

speed    batch 1, one document of n tokens (every position real; the source's sdpa attention on CPU), at
         fractions 1 and 0.5 of the heads constant (the 0.5 drawn at random, so kept and constant heads mix):
         median forward seconds of interleaved repeats, the speed-up, and which product the constant heads used
         in global and local layers (``structured``: profile by FFT, residual, band blocks; ``dense C_S``: built
         from the parts, one GEMM), the crossovers ``STRUCTURED_FROM`` and ``LOCAL_STRUCTURED_FROM``.
memory   peak activation memory of one forward at each n (bytes the CPU allocator holds above what it held
         before the call, from the profiler), source vs fractions 1 and 0.5.
size     checkpoint size at L = 8,192, fraction 1 (the default compact layout there: the diagonal, special slots,
         profile, no residual), fp32 and fp16 constants, vs the source's weights.
crossover  ``C_S X`` of 6 and 12 heads (d = 64) by the dense GEMM vs the structured product, batch 1, 4 and 8,
         global and local (window 64) layers, and the cost of building a dense C_S from the parts (by Toeplitz
         blocks): the numbers behind ``STRUCTURED_FROM`` and ``LOCAL_STRUCTURED_FROM``.

The converted models are ModernBERT-base (random weights) at L = 8,192 made through the public API: ``toeplitz``
constants (``1 / (1 + |i - j|)``; what a constant costs does not depend on its values) built straight into the
default compact layout (no (L, L) matrix per head: at L = 8,192 that would be 67 million values per head), then
``papa_surgery.convert``. The crossover section times the products alone on a harmonic profile with a residual.

Run: python benchmarks/bench_long.py [--lengths 512 2048 8192] [--repeats 3] [--threads 2]
         [--sections speed memory size crossover]
"""

from __future__ import annotations

import argparse
import functools
import random
import tempfile
import time
from pathlib import Path

import torch
from bench_runtime import batch, peak_activation_bytes, source_model
from provenance import add_save_option, recorded
from timing import interleaved_medians

import papa_surgery
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.hub_code import constant_heads
from papa_surgery.hub_code.compact_constants import CompactLayout, special_slots
from papa_surgery.hub_code.modeling_papa import attention_modules
from papa_surgery.hub_code.structured_constants import StructuredSlots

LENGTH = 8192
FRACTIONS = (1.0, 0.5)


def harmonic_parts(layout: CompactLayout, heads: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Compact parts of a harmonic profile plus a small random residual (values do not change the cost)."""
    length, w = layout.max_length, layout.band
    offsets = torch.arange(-(length - 1), length).float()
    profile = (1.0 / (1.0 + offsets.abs())).expand(heads, -1).clone()  # (Hc, 2L-1)
    band = (1.0 / (1.0 + torch.arange(-w, w + 1).abs().float())).expand(heads, length, -1).clone()  # (Hc, L, 2w+1)
    s = len(layout.special)
    return {
        "papa_constants_band": band,
        "papa_constants_rows": torch.full((heads, s, length), 1.0 / length),
        "papa_constants_cols": torch.full((heads, length, s), 0.1),
        "papa_constants_profile": profile,
        "papa_constants_u": torch.randn(heads, length, layout.rank, generator=generator) * 1e-3,
        "papa_constants_v": torch.randn(heads, length, layout.rank, generator=generator) * 1e-3,
    }


def long_converted(source, fraction: float, length: int = LENGTH, seed: int = 0, dtype: str = "float32"):
    """``source`` with ``fraction`` of its heads constant (seeded random choice), through the public API as a user
    converts: ``toeplitz`` constants at L (``papa_surgery.calibrate``, built straight into the default compact layout
    for that L: at 8,192 the diagonal, special slots and profile, no residual), ``papa_surgery.convert``."""
    config = source.config
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    order = [[layer, h] for layer in range(layers) for h in range(heads)]
    random.Random(seed).shuffle(order)
    ranking = papa_surgery.Ranking("random", order, layers, heads)
    constants = papa_surgery.calibrate(source, TOKENIZER(), kind="toeplitz", max_length=length)
    return papa_surgery.convert(source, constants, ranking, fraction, tokenizer=TOKENIZER(), dtype=dtype)


@functools.cache
def TOKENIZER():  # noqa: N802  the embedded MiniLM's WordPiece tokenizer: its ids fit ModernBERT's vocabulary
    return papa_surgery.load("minilm")[1]


def product_used(n: int) -> str:
    """Which product global / local layers' constant heads use for one document of n tokens (S = n rows)."""
    name = lambda threshold: "structured" if n >= threshold else "dense C_S"  # noqa: E731
    return f"{name(constant_heads.STRUCTURED_FROM)} / {name(constant_heads.LOCAL_STRUCTURED_FROM)}"


def speed(lengths, repeats: int, models: dict, record) -> None:
    print("speed: forward seconds, batch 1 (median of interleaved repeats)")
    print(f"{'n':>5s} {'frac':>4s} {'source':>8s} {'convert':>8s} {'speed-up':>8s}  product")
    source = models["source"]
    for n in lengths:
        inputs = batch(source.config, n, 1, padded=False)
        with torch.inference_mode():
            calls = {name: functools.partial(m, **inputs) for name, m in models.items()}
            medians = interleaved_medians(calls, repeats)
        for fraction in FRACTIONS:
            ratio = medians["source"] / medians[fraction]
            record.add({"section": "speed", "n": n, "fraction": fraction, "source_s": medians["source"],
                        "converted_s": medians[fraction], "speedup": ratio, "product": product_used(n)})  # fmt: skip
            print(
                f"{n:5d} {fraction:4.1f} {medians['source']:8.2f} {medians[fraction]:8.2f} {ratio:7.2f}x  "
                f"{product_used(n)}",
                flush=True,
            )


def memory(lengths, models: dict, record) -> None:
    print("memory: peak activation of one forward, batch 1 (MiB; ratio to the source)")
    source = models["source"]
    for n in lengths:
        inputs = batch(source.config, n, 1, padded=False)
        peaks = {name: peak_activation_bytes(m, inputs) for name, m in models.items()}
        record.add({"section": "memory", "n": n, **{f"peak_bytes_{name}": p for name, p in peaks.items()}})
        row = "  ".join(f"{name}: {p / 2**20:8.1f} ({p / peaks['source']:4.2f})" for name, p in peaks.items())
        print(f"{n:5d}  {row}", flush=True)


def size(models: dict, record) -> None:
    """Checkpoint size at L = 8,192, fraction 1, with fp32 and fp16 constants, against the source's weights."""
    mib = 2**20
    with tempfile.TemporaryDirectory() as tmp:
        models["source"].save_pretrained(Path(tmp) / "source")
        src = (Path(tmp) / "source" / "model.safetensors").stat().st_size
        for dtype in ("float32", "float16"):
            papa = models[1.0] if dtype == "float32" else long_converted(models["source"], 1.0, dtype=dtype)
            layout = attention_modules(papa)[0].papa_compact_layout
            out = save_checkpoint(papa, Path(tmp) / dtype, recipe={"benchmark": "bench_long"})
            size = (out / "model.safetensors").stat().st_size
            record.add({"section": "size", "dtype": dtype, "bytes": size, "source_bytes": src, "ratio": size / src})
            print(
                f"size: L={LENGTH} fraction 1, band {layout.band} rank {layout.rank}, {dtype} constants: "
                f"{size / mib:.1f} MiB, source {src / mib:.1f} MiB: {size / src:.3f}x",
                flush=True,
            )


def best(call, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def crossover(repeats: int, record) -> None:
    print("crossover: C_S X, d=64, milliseconds (best of repeats); building C_S from the parts apart")
    print(
        f"{'heads':>5s} {'S':>5s} {'batch':>5s} {'global dense':>12s} {'C_S build':>10s} {'structured':>10s} "
        f"{'local dense':>11s} {'structured':>10s}"
    )
    g = torch.Generator().manual_seed(0)
    for heads in (6, 12):
        for b in (1, 4, 8):
            for s in (256, 384, 512, 768, 1024, 2048):
                length = LENGTH
                layout = CompactLayout(length, 0, 0, special_slots(length, False))  # the long default layout
                parts = harmonic_parts(layout, heads, g)
                order = torch.cat([torch.tensor([length - 1]), torch.arange(s - 1)])
                structured = StructuredSlots(parts, layout, order, [(1, 0, s - 1)], torch.float32)
                dense = structured.dense()
                x = torch.randn(heads, s, b * 65)
                row = [
                    best(functools.partial(dense.product, x), repeats),
                    best(structured.dense, repeats),
                    best(functools.partial(structured.product, x), repeats),
                    best(functools.partial(dense.band_product, x, 64), repeats),
                    best(functools.partial(structured.band_product, x, 64), repeats),
                ]
                print(f"{heads:5d} {s:5d} {b:5d} " + " ".join(f"{t * 1000:10.2f}" for t in row), flush=True)
                names = ("global_dense", "build", "global_structured", "local_dense", "local_structured")
                record.add(
                    {"section": "crossover", "heads": heads, "S": s, "batch": b, **dict(zip(names, row, strict=True))}
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sections", nargs="+", default=["speed", "memory", "size", "crossover"])
    add_save_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with recorded("bench_long", args.save) as record:
        run(args, record)


def run(args, record) -> None:
    print(f"torch {torch.__version__}, {args.threads} threads")
    models = {}
    if {"speed", "memory", "size"} & set(args.sections):
        source = source_model("modernbert")
        models = {"source": source, **{f: long_converted(source, f) for f in FRACTIONS}}
    if "speed" in args.sections:
        speed(args.lengths, args.repeats, models, record)
    if "memory" in args.sections:
        memory(args.lengths, models, record)
    if "size" in args.sections:
        size(models, record)
    if "crossover" in args.sections:
        crossover(args.repeats, record)


if __name__ == "__main__":
    main()
