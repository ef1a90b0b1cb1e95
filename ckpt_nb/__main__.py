"""``python -m ckpt_nb``: the ``ckpt-nb`` command line."""

import sys

from .cli import main

sys.exit(main())
