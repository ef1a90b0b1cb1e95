"""Resumes of a map-style Dataset whose ``__getitem__`` changes its own state (a transform
drawing from its own generator) and which has ``state_dict()`` / ``load_state_dict()``:
the replay of a resumed epoch fetches its skipped batches again, so it starts from the
dataset's state as the epoch began. Scripts killed with SIGKILL and run again, each
against a run never stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_session_loaders import AT_AN_EPOCHS_END, IN_THE_EPOCH, as_meant, killed_and_resumed

AUGMENTED = """
class Noise:
    def __init__(self):
        self.g = torch.Generator().manual_seed(1)
    def __call__(self, x):
        return x + 0.05 * torch.randn(x.shape, generator=self.g)
class Augmented(torch.utils.data.Dataset):
    def __init__(self):
        self.transform = Noise()
    def __len__(self):
        return len(X)
    def __getitem__(self, i):
        return self.transform(X[i]), Y[i]
    def state_dict(self):
        return {{"g": self.transform.g.get_state()}}
    def load_state_dict(self, state):
        self.transform.g.set_state(state["g"])
{loader}
"""
NAMED = "ds = Augmented()\nloader = torch.utils.data.DataLoader(ds, batch_size=20, shuffle=True)"
UNNAMED = "loader = torch.utils.data.DataLoader(Augmented(), batch_size=20, shuffle=True)"


@pytest.mark.parametrize("loader", [NAMED, UNNAMED], ids=["tracked", "reached by the loader"])
@pytest.mark.parametrize("every", [AT_AN_EPOCHS_END, IN_THE_EPOCH])
def test_a_map_style_dataset_changing_in_getitem_resumes_exactly(
        tmp_path: Path, loader: str, every: int) -> None:
    """A map-style dataset's state was no longer taken as an epoch began: a tracked one
    was put back as at the save, and the replay of the skipped batches drew from its
    generator again (every later batch augmented otherwise); one the loader alone reaches
    was not saved at all, and went on from its state in the fresh process."""
    expected, resumed, said = killed_and_resumed(tmp_path, AUGMENTED.format(loader=loader), every)
    assert as_meant(every, said), said
    assert resumed == expected
