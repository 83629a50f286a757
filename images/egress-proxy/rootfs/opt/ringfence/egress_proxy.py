"""Start the ringfence egress proxy: `python3 -I -S -B egress_proxy.py --config FILE`.

-I keeps PYTHON* variables and the working directory out of sys.path, so the package is put
there explicitly, from this file's own directory (read-only, root-owned in the image).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rfegress.server import main  # noqa: E402

sys.exit(main())
