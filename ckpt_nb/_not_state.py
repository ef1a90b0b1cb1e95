"""NotState: the base of ckpt_nb's own objects that are never a run's state (a leaf
module, for the modules the command line imports without torch)."""

from __future__ import annotations


class NotState:
    """A base of ckpt_nb's own objects that a namespace may hold and that are never a
    run's state (a store's manager, a checkpoint loaded, a report, a plot, the
    explorer): a save neither holds one nor names it as left out, as it would a user's
    object it cannot save (named to track, ``--track mgr``, it says it is ckpt_nb's own,
    not training state), and a rollback or resume leaves the variable as it is."""
