#!/usr/bin/env python3
"""benches/adaptive.py (tools/qproxy_tools/bench/adaptive.py; `benches/adaptive.py --help`)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "tools"))

from qproxy_tools.bench import adaptive  # noqa: E402

sys.exit(adaptive.main())
