"""The cluster of scripts/cluster (cli): its builds, its node, Knative in it,
and Knative's own tests run there (knative_tests)."""
