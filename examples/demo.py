"""The README demo: convert the embedded all-MiniLM-L6-v2 at fraction 0.5, reload it in a fresh process.

1. ``papa-surgery convert minilm --fraction 0.5`` on the bundled WikiText-2 excerpt (offline);
2. a fresh Python process loads the folder with ``AutoModel.from_pretrained(..., trust_remote_code=True)``
   without papa-surgery importable;
3. prints which heads changed, how close the sentence embeddings stay, and what it saved in size and time.

Run: python examples/demo.py [--out runs/minilm-papa-0.5] [--fraction 0.5] [--max-examples 600]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner

from papa_surgery.calibration.corpus import default_corpus_path
from papa_surgery.cli import main as cli
from papa_surgery.models.sources import embedded_model_path

SENTENCES = [
    "Constant attention matrices replace half of the heads.",
    "The European lobster lives in the eastern Atlantic Ocean.",
    "A frozen encoder is probed with a small classifier on top.",
    "How much does attention actually attend?",
] * 4


def time_interleaved(fns: dict, repeats: int = 7, warmup: int = 2, clock=None) -> dict:
    """Median seconds per call of each function, measured side by side as ``benchmarks/`` do.

    Every function is warmed up first (``warmup`` calls each: lazy initialisation, allocator, caches), then
    the timed calls alternate between the functions, so drift in machine load hits all of them alike.
    """
    import statistics
    import time

    clock = clock or time.perf_counter
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


# Runs in a fresh interpreter: only torch + transformers, papa_surgery made unimportable.
COMPARE = inspect.getsource(time_interleaved) + textwrap.dedent(
    """
    import json, sys
    sys.modules["papa_surgery"] = None
    import torch
    from transformers import AutoModel, AutoTokenizer
    source_dir, papa_dir, sentences = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    tok = AutoTokenizer.from_pretrained(papa_dir, trust_remote_code=True)
    source = AutoModel.from_pretrained(source_dir).eval()
    papa = AutoModel.from_pretrained(papa_dir, trust_remote_code=True).eval()
    enc = tok(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")

    def embed(model):
        out = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((out * mask).sum(1) / mask.sum(1), dim=-1)

    with torch.inference_mode():
        cos = (embed(source) * embed(papa)).sum(-1)
        seconds = time_interleaved({"source": lambda: embed(source), "papa": lambda: embed(papa)})
    print(json.dumps({"class": type(papa).__name__, "cosine_mean": cos.mean().item(), "cosine_min": cos.min().item(),
                      "seconds_source": seconds["source"], "seconds_papa": seconds["papa"]}))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/minilm-papa-0.5")
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--max-examples", type=int, default=600)
    args = parser.parse_args()

    source_dir = embedded_model_path()
    command = [
        "convert", "minilm", "--fraction", str(args.fraction), "--corpus", str(default_corpus_path()),
        "--max-examples", str(args.max_examples), "--out", args.out, "--overwrite",
    ]  # fmt: skip
    print("$ papa-surgery " + " ".join(command))
    result = CliRunner().invoke(cli, command, catch_exceptions=False)
    print(result.output.strip())
    if result.exit_code != 0:
        sys.exit(result.exit_code)

    out = Path(args.out)
    config = json.loads((out / "config.json").read_text())
    heads = config["papa_constant_heads"]
    layers, per_layer = config["num_hidden_layers"], config["num_attention_heads"]
    print(f"\nconstant heads ({len(heads)} of {layers * per_layer}, ranked by {config['papa_method']}):")
    for layer in range(layers):
        row = "".join("C" if [layer, h] in heads else "." for h in range(per_layer))
        print(f"  layer {layer}: {row}")

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    proc = subprocess.run(
        [sys.executable, "-I", "-c", COMPARE, source_dir, str(out), json.dumps(SENTENCES)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"fresh-process load failed:\n{proc.stderr[-3000:]}")
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    src_size = (Path(source_dir) / "model.safetensors").stat().st_size
    papa_size = (out / "model.safetensors").stat().st_size
    print(f"\nreloaded in a fresh process as {stats['class']} (trust_remote_code=True, papa-surgery not importable)")
    print(f"sentence-embedding cosine to the source: mean {stats['cosine_mean']:.3f}, min {stats['cosine_min']:.3f}")
    print(f"weights: {src_size / 2**20:.1f} MiB -> {papa_size / 2**20:.1f} MiB ({papa_size / src_size:.3f}x)")
    print(
        f"forward on {len(SENTENCES)} sentences: {stats['seconds_source'] * 1000:.1f} ms -> "
        f"{stats['seconds_papa'] * 1000:.1f} ms ({speed_words(stats['seconds_source'] / stats['seconds_papa'])}; "
        "medians of interleaved runs after warm-up, as benchmarks/bench_short_inputs.py measures)"
    )


def speed_words(ratio: float) -> str:
    """A speed ratio (source time / converted time) in words: "1.19x faster", "1.07x slower", "as fast"."""
    if abs(ratio - 1) < 0.005:
        return "as fast"
    return f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"


if __name__ == "__main__":
    main()
