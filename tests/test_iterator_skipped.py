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
from ckpt_nb._discovery import discover, skipped_text


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


class Cursor:
    """An iterator of the user's own, with its place in a field."""

    __module__ = "__main__"  # (as a notebook's class, or a script's)

    def __init__(self) -> None:
        self.place = 0

    def __iter__(self) -> Cursor:
        return self

    def __next__(self) -> int:
        self.place += 1
        return self.place


def test_iterators_are_said_once_and_one_of_the_users_own_is_told_state_dict() -> None:
    """Each iterator wrote the whole paragraph again on the start line, and one of the
    user's own classes was told to zip a loader, not its way on: a state_dict()."""
    data = torch.utils.data.TensorDataset(torch.randn(8, 2))
    found = discover({"u_iter": iter(torch.utils.data.DataLoader(data)),
                      "steps": itertools.count(), "cursor": Cursor()})
    said = skipped_text(found.skipped)
    assert said.startswith("u_iter (_SingleProcessDataLoaderIter), steps (count): iterators, "
                           "whose places no checkpoint holds"), said
    assert said.count("no checkpoint holds") == 1
    assert said.endswith("cursor (Cursor), no state_dict(): not saved, nor put back on resume; "
                         "give it state_dict()/load_state_dict(), or keep its fields in plain "
                         "variables"), said
