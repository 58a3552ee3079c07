"""``python -m pyro_invariance.diagnostics.reference``: see :mod:`.cli`."""

import sys

from pyro_invariance.diagnostics.reference.cli import main

sys.exit(main())
