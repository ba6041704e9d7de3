"""Benchmark of trace harvesting on the CPU: statistics overhead, streaming memory, steps/s.

Run from the repository root (about 15 minutes on 2 shared cores)::

    python benchmarks/bench_harvest.py                    # Qwen3-0.6B shape, all 28 layers
    python benchmarks/bench_harvest.py --layers 2         # the few-layer case (overhead looks larger)
    python benchmarks/bench_harvest.py --json bench.json  # also write the figures

1. **Overhead.** The same greedy decoding loop (``companion.harvest.decode.decode_batch``) runs
   without statistics (the forward passes alone) and with every per-step statistic and
   certificate, interleaved ``--repeats`` times in one process; the overhead is the ratio of
   median CPU times minus one (one torch thread: the process's CPU time is its work, however
   busy the shared machine), and the same run's time inside the statistics over the rest. Models are random Qwen3-0.6B-shaped (vocabulary 151,936, hidden
   1,024, 16/8 heads, MLP 3,072), with ``--logit-scale`` sharpening the logits so that the
   target's top-1 probability has a median around 0.5, as a trained model's: with flat random
   logits the certificate engine takes its rare deep-boundary path on every step, which
   measures a worst case rather than a harvest (``--logit-scale 1`` shows it). Reported with and
   without a drafter (a Qwen3-0.6B shape with ``--drafter-layers`` layers).
2. **Memory.** ``harvest`` runs in a fresh subprocess for two prompt counts; its peak RSS during
   the harvest (``VmHWM`` after resetting it once the models are built) and the peak of Python-level allocations (``tracemalloc``, which sees NumPy and
   Arrow buffers but not torch's) should not grow with the number of prompts: the harvest streams
   (one batch of steps on the device, one shard of rows on the host, at a time).
3. **Throughput.** steps/s (rows of the trace per second) of the full pipeline.

There is no GPU on the development machines: GPU timings are not measured here.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _timed(fn) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of ``fn()``.

    With one torch thread the process's CPU time is the work done, unaffected by other jobs
    taking the cores; wall time is reported too but is noisy on a shared machine.
    """
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


class _TimedStats:
    """Wraps StepStatistics to accumulate the CPU time spent inside it (same run, same steps)."""

    def __init__(self, stats) -> None:
        self.stats, self.cpu = stats, 0.0

    def __call__(self, *a, **k):
        c0 = time.process_time()
        try:
            return self.stats(*a, **k)
        finally:
            self.cpu += time.process_time() - c0


def overhead(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from companion.certify.criteria import PAPER_CRITERIA
    from companion.harvest.decode import decode_batch
    from companion.harvest.shapes import random_qwen3
    from companion.harvest.stats import StepStatistics

    t0 = time.perf_counter()
    target = random_qwen3(args.shape, args.layers, seed=0, logit_scale=args.logit_scale)
    drafter = random_qwen3("Qwen3-0.6B", args.drafter_layers, seed=1, logit_scale=args.logit_scale)
    print(f"built models in {time.perf_counter() - t0:.1f} s: target {args.shape} x{args.layers} layers, "
          f"drafter Qwen3-0.6B x{args.drafter_layers} layers, logit scale {args.logit_scale}", flush=True)
    vocab = target.config.vocab_size
    stats = StepStatistics(PAPER_CRITERIA, (1, 2, 4, 8), vocab=vocab)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.batch_size)]
    kw = dict(chunk_steps=args.chunk_steps, pad_id=0, stop_at_eos=False)
    t_stats, d_stats = _TimedStats(stats), _TimedStats(stats)
    variants = {
        "target prefill + 1 step": lambda: decode_batch(target, None, prompts, 1, None, **kw),
        "target+drafter prefill + 1 step": lambda: decode_batch(target, drafter, prompts, 1, None, **kw),
        "target forward": lambda: decode_batch(target, None, prompts, args.steps, None, **kw),
        "target + statistics": lambda: decode_batch(target, None, prompts, args.steps, t_stats, **kw),
        "target+drafter forward": lambda: decode_batch(target, drafter, prompts, args.steps, None, **kw),
        "target+drafter + statistics": lambda: decode_batch(target, drafter, prompts, args.steps, d_stats, **kw),
    }
    shape = decode_batch(target, drafter, prompts, args.steps, stats, **kw).columns  # warm-up, and the step shape
    p1 = np.median(shape["p_top1"])
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    inside = {"target + statistics": [], "target+drafter + statistics": []}
    for r in range(args.repeats):
        for name, fn in variants.items():
            for w in (t_stats, d_stats):
                w.cpu = 0.0
            c, t = _timed(fn)
            cpu[name].append(c)
            wall[name].append(t)
            if name in inside:
                inside[name].append((t_stats if name == "target + statistics" else d_stats).cpu)
        print(f"  repeat {r + 1}/{args.repeats} (CPU s): " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in cpu.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    med_inside = {k: statistics.median(v) for k, v in inside.items()}
    steps = args.batch_size * args.steps
    out = {
        "shape": args.shape, "layers": args.layers, "drafter_layers": args.drafter_layers, "vocab": vocab,
        "batch_size": args.batch_size, "steps": args.steps, "prompt_tokens": args.prompt_tokens,
        "chunk_steps": args.chunk_steps, "threads": torch.get_num_threads(), "median_p_top1": float(p1),
        "median_cpu_s": med, "median_wall_s": {k: statistics.median(v) for k, v in wall.items()},
        "median_cpu_s_inside_statistics": med_inside,
        # A/B: whole runs with and without the statistics.
        "overhead_target_only": med["target + statistics"] / med["target forward"] - 1,
        "overhead_with_drafter": med["target+drafter + statistics"] / med["target+drafter forward"] - 1,
        # Same run: time inside the statistics over the rest of that very run.
        "overhead_target_only_same_run": med_inside["target + statistics"]
        / (med["target + statistics"] - med_inside["target + statistics"]),
        "overhead_with_drafter_same_run": med_inside["target+drafter + statistics"]
        / (med["target+drafter + statistics"] - med_inside["target+drafter + statistics"]),
        "stats_ms_per_step_target_only": 1e3 * med_inside["target + statistics"] / args.steps,
        "stats_ms_per_step_with_drafter": 1e3 * med_inside["target+drafter + statistics"] / args.steps,
        # Per decode step: the forward of one step (prefill removed) against the statistics of one step.
        "decode_forward_ms_per_step_target_only": 1e3 * (med["target forward"] - med["target prefill + 1 step"])
        / (args.steps - 1),
        "decode_forward_ms_per_step_with_drafter": 1e3 * (med["target+drafter forward"]
                                                          - med["target+drafter prefill + 1 step"]) / (args.steps - 1),
        "steps_per_s_full_cpu_time": steps / med["target+drafter + statistics"],
        "steps_per_s_full_wall": steps / statistics.median(wall["target+drafter + statistics"]),
    }
    return out


_CHILD = r"""
import json, resource, sys, tracemalloc, torch
torch.set_num_threads(1)
tracemalloc.start()
from companion.harvest import harvest
from companion.harvest.shapes import random_qwen3
from companion.harvest.toy import byte_tokenizer
n, steps, out, layers, scale = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
target = random_qwen3("Qwen3-0.6B", layers, seed=0, logit_scale=scale)
drafter = random_qwen3("Qwen3-0.6B", 1, seed=1, logit_scale=scale)
texts = [f"def function_{i}(x):\n    return x * {i} + {i % 7}\n" * (1 + i % 3) for i in range(n)]
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
before = status("VmRSS:")
try:  # reset the high-water mark so that it measures the harvest alone (Linux >= 4.0)
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
base = tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
m = harvest(target, drafter, byte_tokenizer(), texts, out, n_steps=steps, batch_size=4, progress=False)
peak = tracemalloc.get_traced_memory()[1] - base
print(json.dumps({"prompts": n, "rows": m["totals"]["rows"], "rss_before_mb": round(before, 1),
                  "peak_rss_during_harvest_mb": round(status("VmHWM:"), 1),
                  "tracemalloc_peak_mb": round(peak / 2**20, 3), "steps_per_s": m["runs"][-1]["steps_per_s"]}))
"""


def memory(args: argparse.Namespace) -> list[dict]:
    results = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for n in args.memory_prompts:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, "-c", _CHILD, str(n), str(args.memory_steps), str(Path(tmp) / "h"),
                                str(args.memory_layers), str(args.logit_scale)],
                               capture_output=True, text=True, env=env, check=False)
            if r.returncode:
                raise RuntimeError(r.stderr)
            results.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(f"  {n:4d} prompts: {results[-1]}", flush=True)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="Qwen3-0.6B", help="target shape (companion.harvest.shapes)")
    p.add_argument("--layers", type=int, default=28, help="target layers (28: the real Qwen3-0.6B depth)")
    p.add_argument("--drafter-layers", type=int, default=4, help="drafter layers (Qwen3-0.6B shape)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--chunk-steps", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    p.add_argument("--logit-scale", type=float, default=12.0, help="sharpens random logits (see the module docstring)")
    p.add_argument("--memory-prompts", type=int, nargs="+", default=[8, 64])
    p.add_argument("--memory-steps", type=int, default=8)
    p.add_argument("--memory-layers", type=int, default=2)
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    report: dict = {"gpu": "not measured: no GPU on this machine", "load_average": os.getloadavg()}
    print(f"torch {torch.__version__}, {args.threads} thread(s), load average {os.getloadavg()}")
    if not args.skip_overhead:
        print("overhead of the statistics over the forward passes:")
        o = overhead(args)
        report["overhead"] = o
        print(f"  median p(1) of the target: {o['median_p_top1']:.3f}")
        for k in o["median_cpu_s"]:
            print(f"  {k:30s} median CPU {o['median_cpu_s'][k]:7.2f} s   wall {o['median_wall_s'][k]:7.2f} s")
        for what, key in (("target only", "target_only"), ("with drafter", "with_drafter")):
            print(f"  overhead, {what:13s} A/B {100 * o['overhead_' + key]:6.1f} %   same run "
                  f"{100 * o['overhead_' + key + '_same_run']:6.1f} %   "
                  f"({o['stats_ms_per_step_' + key]:.1f} ms CPU per step of {args.batch_size} prompts)")
        for what, key in (("target only", "target_only"), ("with drafter", "with_drafter")):
            fwd, st = o["decode_forward_ms_per_step_" + key], o["stats_ms_per_step_" + key]
            o["overhead_per_decode_step_" + key] = st / fwd
            print(f"  per decode step, {what:13s}: forward {fwd:7.1f} ms, statistics {st:6.1f} ms "
                  f"({100 * st / fwd:.1f} %; prefill excluded)")
        print(f"  full pipeline: {o['steps_per_s_full_cpu_time']:.2f} steps/s of CPU time, "
              f"{o['steps_per_s_full_wall']:.2f} steps/s wall")
    if not args.skip_memory:
        print("peak memory of a whole harvest (subprocess) at two prompt counts:")
        report["memory"] = memory(args)
    print("GPU: not measured (no GPU on this machine).")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
