#!/usr/bin/env python3
"""deploy/oci_image.py: packs a static binary into an image archive, no
daemon needed (tools/qproxy_tools/oci_image.py; `deploy/oci_image.py --help`)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "tools"))

from qproxy_tools import oci_image  # noqa: E402

sys.exit(oci_image.main())
