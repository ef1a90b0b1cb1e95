"""The notebook layer's costs, as ratios against what a user would otherwise do.

1. Training-loop stall per checkpoint with the background writer, against a
   synchronous torch.save + fsync of the same state (target <= 0.15x).
2. Overhead of an active session (step hooks, loop helpers) on a training loop
   that triggers no save, against the same loop without it (target <= 2%).
3. Rollback of a model plus AdamW state of ~100 MB, in seconds (target <= 0.3 s).

Run: .venv/bin/python benchmarks/bench_notebook.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import ckpt_nb


def model_and_optimizer(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step(model, opt)
    return model, opt


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: int = 32) -> None:
    opt.zero_grad()
    model(torch.randn(batch, 64)).square().mean().backward()
    opt.step()


def state_mb(model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    tensors = list(model.state_dict().values()) + [
        v for s in opt.state_dict()["state"].values() for v in s.values()]
    return sum(t.numel() * t.element_size() for t in tensors) / 1e6


def torch_save_fsync(model: torch.nn.Module, opt: torch.optim.Optimizer, path: Path) -> float:
    start = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - start


def bench_stall(width: int, repeats: int, tmp: Path) -> None:
    model, opt = model_and_optimizer(width)
    namespace = {"model": model, "opt": opt}
    stalls, baselines = [], []
    with ckpt_nb.auto(str(tmp / "stall"), namespace=namespace, name="stall") as session:
        for r in range(repeats):
            step(model, opt)
            start = time.perf_counter()
            session.save(reason="bench")  # the training thread's share: the snapshot
            stalls.append(time.perf_counter() - start)
            session.writer.wait()
            baselines.append(torch_save_fsync(model, opt, tmp / f"base{r}.pt"))
    ratio = statistics.median(s / b for s, b in zip(stalls, baselines))
    print(f"1. stall per checkpoint ({state_mb(model, opt):.0f} MB of state): "
          f"{statistics.median(stalls) * 1e3:.1f} ms vs torch.save+fsync "
          f"{statistics.median(baselines) * 1e3:.1f} ms = {ratio:.3f}x  "
          f"{'target met' if ratio <= 0.15 else 'MISSED'} (<= 0.15x)")


def bench_overhead(repeats: int, tmp: Path, steps: int) -> None:
    torch.set_num_threads(1)
    data = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(steps)]

    def loop(model: torch.nn.Module, opt: torch.optim.Optimizer, use_helpers: bool) -> float:
        start = time.perf_counter()
        batches = ckpt_nb.batches(data) if use_helpers else enumerate(data)
        for _, (x, y) in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return time.perf_counter() - start

    def plain_run() -> float:
        return loop(*model_and_optimizer(256), use_helpers=False)

    def wrapped_run(r: int) -> float:
        model, opt = model_and_optimizer(256)
        with ckpt_nb.auto(str(tmp / f"over{r}"), namespace={"model": model, "opt": opt},
                          name="o", every_steps=10**9):
            return loop(model, opt, use_helpers=True)  # the final save is not timed

    plain, wrapped = [], []
    for r in range(2 * repeats):  # who runs first alternates: order effects cancel
        if r % 2:
            wrapped.append(wrapped_run(r)); plain.append(plain_run())
        else:
            plain.append(plain_run()); wrapped.append(wrapped_run(r))
    overhead = statistics.median(w / p for w, p in zip(wrapped, plain)) - 1
    print(f"2. overhead of a session on {steps} steps with no save: {overhead * 100:+.2f}%  "
          f"{'target met' if overhead <= 0.02 else 'MISSED'} (<= 2%)")


def bench_rollback(width: int, repeats: int, tmp: Path) -> None:
    model, opt = model_and_optimizer(width)
    namespace = {"model": model, "opt": opt}
    times = []
    with ckpt_nb.auto(str(tmp / "rollback"), namespace=namespace, name="rb") as session:
        session.save(reason="bench", wait=True)
        target = session.writer.last_id
        for _ in range(repeats):
            step(model, opt)
            start = time.perf_counter()
            session.rollback(target)
            times.append(time.perf_counter() - start)
    best = statistics.median(times)
    print(f"3. rollback of {state_mb(model, opt):.0f} MB (model + AdamW): {best:.3f} s  "
          f"{'target met' if best <= 0.3 else 'MISSED'} (<= 0.3 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small repeat of each")
    args = parser.parse_args()
    repeats = 1 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix="ckpt_nb_bench_") as name:
        tmp = Path(name)
        width = 600 if args.quick else 2880  # 2880: ~8.5M parameters, ~100 MB with AdamW
        bench_stall(width, repeats, tmp)
        bench_overhead(repeats, tmp, steps=50 if args.quick else 300)
        bench_rollback(width, repeats, tmp)


if __name__ == "__main__":
    main()
