#!/usr/bin/env python3
"""benches/harness.py: the side-by-side benchmark
(tools/qproxy_tools/bench/harness.py; `benches/harness.py --help`)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "tools"))

from qproxy_tools.bench import harness  # noqa: E402

sys.exit(harness.main())
