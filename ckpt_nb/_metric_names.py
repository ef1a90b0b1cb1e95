"""Which way a metric's name says is better: one rule for the manager's ``keep_best``,
the magics' ``--on``, the CLI's ``--metric`` and the plots' best marks, so that no two of
them rank one metric two ways."""

from __future__ import annotations

import re

# Parts of a metric's name that say which way is better.
_HIGHER_BETTER = ("acc", "f1", "auc", "score", "precision", "recall", "reward", "bleu",
                 "rouge", "psnr", "ssim", "ndcg")
_LOWER_BETTER = ("loss", "err", "perplexity", "ppl", "mse", "mae", "nll", "cost")
# Short names, as words only: "iou" is in "previous_loss", "wer" in "power", "fid" in
# "confidence" (map50 and val_wer are words here: a digit or "_" may follow or lead).
_HIGHER_WORDS = re.compile(r"(?<![a-z])(iou|miou|map|dice)(?![a-z])")
_LOWER_WORDS = re.compile(r"(?<![a-z])(wer|cer|fid)(?![a-z])")


def metric_mode_from_name(name: str) -> str | None:
    """"min" or "max" where the name says which way is better (a loss, an accuracy),
    else None: a wrong guess would keep the worst checkpoints as the best."""
    lower = name.lower()
    higher = any(part in lower for part in _HIGHER_BETTER)
    lower_better = any(part in lower for part in _LOWER_BETTER)
    if not higher and not lower_better:  # (a short word alone: dice_loss is a loss)
        higher = bool(_HIGHER_WORDS.search(lower))
        lower_better = bool(_LOWER_WORDS.search(lower))
    if higher == lower_better:
        return None  # (neither, or both: "score_loss")
    return "max" if higher else "min"
