#!/usr/bin/env python3
"""Writes qproxy-revision.json, the revision dashboard, from its panels'
definitions (tools/qproxy_tools/dashboard/panels.py)."""

import os
import sys

here = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tools"))

from qproxy_tools.dashboard import panels  # noqa: E402

sys.exit(panels.main())
