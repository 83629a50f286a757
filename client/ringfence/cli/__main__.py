"""`python -m ringfence.cli`: the `ringfence` command."""

import sys

from ringfence.cli.main import main

sys.exit(main())
