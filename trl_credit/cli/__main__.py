"""`python -m trl_credit.cli COMMAND ...`: the `trl-credit` console script, for environments without it."""

import sys

from . import main

sys.exit(main())
