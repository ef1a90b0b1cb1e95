"""A module with a sparse buffer (a GCN's adjacency) restores as torch's load_state_dict
takes it, bit-exact: its layout is not a strided tensor's, so no stride test applies."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from ckpt_nb import CheckpointManager, StateMismatchError

pytestmark = pytest.mark.filterwarnings("ignore:Sparse .* support is in beta")

LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "coo": lambda a: a.to_sparse().coalesce(),
    "csr": lambda a: a.to_sparse_csr(),
    "csc": lambda a: a.to_sparse_csc(),
}


class Graph(torch.nn.Module):
    def __init__(self, layout: str, seed: int, threshold: float = 0.5) -> None:
        super().__init__()
        adjacency = torch.rand(6, 6, generator=torch.Generator().manual_seed(seed))
        adjacency[adjacency < threshold] = 0
        self.register_buffer("adj", LAYOUTS[layout](adjacency))
        self.lin = torch.nn.Linear(6, 6)


def parts(t: torch.Tensor) -> list[torch.Tensor]:
    if t.layout is torch.sparse_coo:
        return [t.indices(), t.values()]
    if t.layout is torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


def assert_same(live: torch.Tensor, saved: torch.Tensor) -> None:
    assert live.layout == saved.layout and live.shape == saved.shape
    for a, b in zip(parts(live), parts(saved), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_sparse_buffer_restores_bit_exact(tmp_path: Path, layout: str) -> None:
    mgr = CheckpointManager(tmp_path / "s")
    saved = Graph(layout, seed=0)
    cid = mgr.save(saved, None, 0)
    # (other values; for a compressed layout as many set, which torch copies only so)
    fresh = Graph(layout, seed=1) if layout == "coo" else Graph(layout, seed=0)
    fresh.adj.values().mul_(3)
    mgr.restore(cid, model=fresh)
    assert_same(fresh.adj, saved.adj)
    assert torch.equal(fresh.lin.weight, saved.lin.weight)

    torch.save({"model": saved.state_dict()}, tmp_path / "graph.pt")
    again = Graph(layout, seed=0)
    again.adj.values().zero_()
    mgr.restore(tmp_path / "graph.pt", model=again)
    assert_same(again.adj, saved.adj)


@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_a_compressed_buffer_of_another_count_is_refused_before_anything_changes(
        tmp_path: Path, layout: str) -> None:
    mgr = CheckpointManager(tmp_path)
    cid = mgr.save(Graph(layout, seed=0), None, 0)
    fresh = Graph(layout, seed=1, threshold=-1.0)  # (every element set)
    before = fresh.lin.weight.clone()
    with pytest.raises(StateMismatchError, match="elements set.*take it from load"):
        mgr.restore(cid, model=fresh)
    assert torch.equal(fresh.lin.weight, before)


class Blocks(torch.nn.Module):
    def __init__(self, adj: torch.Tensor) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)  # (loaded ahead of the buffer)
        self.register_buffer("adj", adj)


DIAGONAL = torch.eye(4)
CORNERS = torch.zeros(4, 4).index_put_((torch.tensor([0, 3]), torch.tensor([0, 3])),
                                       torch.tensor([1.0, 1.0]))


@pytest.mark.parametrize("saved, live, said", [
    # (as many blocks set, of another size: torch's copy_ refuses once it gets there)
    (DIAGONAL.to_sparse_bsr((2, 2)), CORNERS.to_sparse_bsr((4, 1)), "blocks or dense part"),
    # (sparse and dense dimensions split otherwise: resize_ refuses on a non-empty tensor)
    (DIAGONAL.to_sparse(1), CORNERS.to_sparse(), "1 sparse and 1 dense dimensions"),
], ids=["bsr-block-size", "coo-hybrid"])
def test_a_sparse_buffer_torch_cannot_copy_is_refused_before_anything_changes(
        tmp_path: Path, saved: torch.Tensor, live: torch.Tensor, said: str) -> None:
    mgr = CheckpointManager(tmp_path)
    cid = mgr.save(Blocks(saved), None, 0)
    fresh = Blocks(live)
    before = fresh.lin.weight.clone()
    with pytest.raises(StateMismatchError, match=f"(?s)nothing was changed.*{said}"):
        mgr.restore(cid, model=fresh)
    assert torch.equal(fresh.lin.weight, before)
