"""The benchmarks: side by side on loopback (harness), adaptive concurrency
under overload (adaptive), and in the cluster (in_cluster)."""
