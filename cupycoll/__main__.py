"""``python -m cupycoll``: see :mod:`cupycoll._cli`."""

import sys

from ._cli import main

sys.exit(main())
