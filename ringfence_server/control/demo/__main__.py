"""`python -m ringfence_server.control.demo`: the sandbox showcase, then the reference demo."""

import sys

from ringfence_server.control.demo.cli import run_all

sys.exit(run_all())
