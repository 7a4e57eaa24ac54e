"""The project's own tooling: the cluster (`scripts/cluster`), Knative's
tests in it (`tests/cluster/knative`), the benchmarks (`benches/*.py`), the
daemonless image packer (`deploy/oci_image.py`) and the path-routing
component's generator. Each command at its documented path is a few lines
that start one module's `main` here."""

import os

# The repository's root.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
