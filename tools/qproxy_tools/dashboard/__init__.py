"""The revision dashboard (deploy/dashboards/): its panels and queries, the
Grafana JSON written from them, and what the cluster's test of every query
found, compared between the queue-proxies and drawn."""
