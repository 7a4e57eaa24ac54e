#!/usr/bin/env python3
"""benches/cluster.py (tools/qproxy_tools/bench/in_cluster.py; `benches/cluster.py --help`)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "tools"))

from qproxy_tools.bench import in_cluster  # noqa: E402

sys.exit(in_cluster.main())
