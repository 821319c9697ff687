"""Where a forward's time goes on a GPU: launch time against finish time, and torch.profiler's tables.

BERT-base with random weights (``bench_runtime.source_model``), n=128, a padded batch of 128, bf16 on CUDA: the source
and its conversions at fractions 1 and 0.5 (``bench_runtime.converted``). For each: the milliseconds a forward takes
to *launch* (the host returns) and to *finish* (after ``torch.cuda.synchronize``), means of 10 after 3 warm-ups; where
the two are equal the forward is bound by launching kernels, not by running them. Then the profiler's top operators
by CUDA time and by CPU time over 3 forwards of the source and of fraction 1.

Run (on a machine with a GPU): python benchmarks/profile_runtime.py
"""

from __future__ import annotations

import time

import torch
from bench_runtime import batch, converted, placed, source_model


def main() -> None:
    where = {"device": "cuda", "dtype": "bfloat16", "batch_scale": 1}
    source = source_model("bert")
    models = {"source": source, 1.0: converted(source, 1.0, 128), 0.5: converted(source, 0.5, 128)}
    models = {name: placed(m, where) for name, m in models.items()}
    inputs = batch(source.config, 128, 128, True, "cuda")
    for name, model in models.items():
        with torch.inference_mode():
            for _ in range(3):
                model(**inputs)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                model(**inputs)
            launched = (time.perf_counter() - start) / 10
            torch.cuda.synchronize()
            finished = (time.perf_counter() - start) / 10
        print(f"{name}: dispatch {launched * 1e3:.2f} ms/forward, with GPU {finished * 1e3:.2f} ms", flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for name in ("source", 1.0):
        with torch.inference_mode(), torch.profiler.profile(activities=activities) as prof:
            for _ in range(3):
                models[name](**inputs)
            torch.cuda.synchronize()
        for key in ("self_cuda_time_total", "self_cpu_time_total"):
            print(name, "by", key)
            print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=50))


if __name__ == "__main__":
    main()
