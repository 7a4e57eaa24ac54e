#!/usr/bin/env python3
"""Routes apps behind one host by path prefix, for Gateway API and for
Istio: rewrites gateway-api/ and istio/ from apps.conf
(tools/qproxy_tools/path_routing.py has the file's format; `./generate.py --help`)."""

import os
import sys

here = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "tools"))

from qproxy_tools import path_routing  # noqa: E402

sys.exit(path_routing.main())
