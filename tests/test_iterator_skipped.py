"""An iterator in the notebook (``u_iter = iter(unlabeled)``, drawn with ``next()`` in the
loop: a second stream of a semi-supervised loop or a GAN) was named on the start line by
its type alone, ``u_iter (_SingleProcessDataLoaderIter)``, though a resume goes on from
where it stands then, not from where the stopped run was: the run after a crash trains
on other batches than an unstopped one. The line says so now, and the way that
resumes exactly."""

from __future__ import annotations

import itertools

import torch

import ckpt_nb
from ckpt_nb._discovery import discover


def test_an_iterator_is_said_not_to_resume_where_it_was() -> None:
    data = torch.utils.data.TensorDataset(torch.randn(8, 2))
    unlabeled = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
    found = discover({"u_iter": iter(unlabeled), "steps": itertools.count(),
                      "it": ckpt_nb.epochs(3)})
    assert found.skipped["u_iter"].startswith("_SingleProcessDataLoaderIter: an iterator, "
                                              "whose place no checkpoint holds")
    assert "`batches(zip(loader, other))`" in found.skipped["u_iter"]
    assert found.skipped["steps"].startswith("count: an iterator")
    assert "it" not in found.skipped  # (ckpt_nb's own loop helper)
