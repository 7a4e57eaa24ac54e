"""The revision dashboard: its panels, each with its queries, and the
Grafana JSON model written from them (deploy/dashboards/qproxy-revision.json).

Every query selects a revision by the target labels Prometheus gives a
queue-proxy's series (`namespace` and `revision`, from the pod; see
cluster/manifests/prometheus.yaml): current Knative's request metrics carry
no revision label of their own, classic Knative's carry `revision_name`, so
only the target labels serve both. Where the two generations name a family
differently, a query asks for both, joined by `or`: a revision's pod serves
one or the other.

A panel is Knative's when its queries read Knative's families (served by
Knative's queue-proxy and by qproxy alike), qproxy's when they read qproxy's
own (`qproxy_`; empty with Knative's queue-proxy).
"""

import inspect
import json
import os
from dataclasses import dataclass, field

from .. import ROOT, arguments

# The revision's series, as the dashboard's variables pick it.
SELECTOR = 'namespace="$namespace", revision="$revision"'
WINDOW = "$__rate_interval"
UID = "qproxy-revision"
TITLE = "qproxy: a Knative revision's queue-proxy"


def select(family, extra=""):
    """`family` of the chosen revision, with `extra` matchers."""
    return f"{family}{{{SELECTOR}{', ' + extra if extra else ''}}}"


def either(classic, current):
    """One query for both generations: classic Knative's family or current
    Knative's, whichever the revision's pod serves."""
    return f"({classic}) or ({current})"


def as_code(expr, label):
    """`expr` with its status-code label, whatever its generation calls it,
    copied to `code`."""
    return f'label_replace({expr}, "code", "$1", "{label}", "(.*)")'


def quantile(q, bucket, scale=""):
    return f"histogram_quantile({q}, sum by (le) (rate({select(bucket)}[{WINDOW}]))){scale}"


# Requests as each generation counts them where they enter the queue-proxy
# (every request, answered by the app or not) and where they reach the app.
CLASSIC_IN, CURRENT_IN = "revision_request_count", "http_server_request_duration_seconds_count"
CLASSIC_APP, CURRENT_APP = "revision_app_request_count", "kn_serving_invocation_duration_seconds_count"
CLASSIC_CODE, CURRENT_CODE = "response_code", "http_response_status_code"


def by_code(family, code_label, over):
    """`over` (rate, or increase over the dashboard's range) of `family`,
    summed by status code."""
    window = WINDOW if over == "rate" else "$__range"
    counted = f"{over}({select(family)}[{window}])"
    return f"sum by (code) ({as_code(counted, code_label)})"


def full_queue(family_in, family_app, code_label):
    """503s the queue-proxy gave without asking the app: its 503s less the
    app's (none when the app gave none)."""
    refused = f'{code_label}="503"'
    given = f"sum(rate({select(family_in, refused)}[{WINDOW}]))"
    by_app = f"sum(rate({select(family_app, refused)}[{WINDOW}]))"
    return f"{given} - ({by_app} or {given} * 0)"


@dataclass
class Target:
    expr: str
    legend: str


@dataclass
class Panel:
    title: str
    description: str
    unit: str
    targets: list
    kind: str = "timeseries"
    width: int = 12

    @property
    def source(self):
        """Whose families the panel reads: "qproxy" or "knative"."""
        return "qproxy" if any("qproxy_" in t.expr for t in self.targets) else "knative"


@dataclass
class Row:
    title: str
    panels: list = field(default_factory=list)


ROWS = [
    Row(
        "Requests",
        [
            Panel(
                "Requests per second, by status code",
                "Every request the queue-proxy answered, the app's and its own (a 503 from a full queue, a 504 "
                "at the timeout). Classic Knative: revision_request_count; current: "
                "http_server_request_duration_seconds_count.",
                "reqps",
                [
                    Target(
                        either(by_code(CLASSIC_IN, CLASSIC_CODE, "rate"), by_code(CURRENT_IN, CURRENT_CODE, "rate")),
                        "{{code}}",
                    )
                ],
            ),
            Panel(
                "Requests in the range, by status code",
                "The same requests, counted over the dashboard's time range.",
                "none",
                [
                    Target(
                        either(
                            by_code(CLASSIC_IN, CLASSIC_CODE, "increase"), by_code(CURRENT_IN, CURRENT_CODE, "increase")
                        ),
                        "{{code}}",
                    )
                ],
                kind="stat",
            ),
        ],
    ),
    Row(
        "Latency",
        [
            Panel(
                "Latency through the queue-proxy",
                "From the request's arrival at the queue-proxy to its answer: the time in the queue and in the "
                "app. Classic Knative: revision_request_latencies (milliseconds); current: "
                "http_server_request_duration_seconds.",
                "s",
                [
                    Target(
                        either(
                            quantile(q, "revision_request_latencies_bucket", " / 1000"),
                            quantile(q, "http_server_request_duration_seconds_bucket"),
                        ),
                        f"p{round(q * 100)}",
                    )
                    for q in (0.5, 0.9, 0.99)
                ],
            ),
            Panel(
                "Latency of the app",
                "The app's own time, from the queue-proxy's request to it to the app's answer. Classic "
                "Knative: revision_app_request_latencies (milliseconds); current: "
                "kn_serving_invocation_duration_seconds.",
                "s",
                [
                    Target(
                        either(
                            quantile(q, "revision_app_request_latencies_bucket", " / 1000"),
                            quantile(q, "kn_serving_invocation_duration_seconds_bucket"),
                        ),
                        f"p{round(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ],
            ),
        ],
    ),
    Row(
        "Concurrency, as the autoscaler sees it",
        [
            Panel(
                "Concurrency as the autoscaler sees it",
                "Requests in the queue-proxy (queued or at the app), averaged over each reporting window: "
                "what the queue-proxy reports to Knative's autoscaler on 9090, which Knative does not export. "
                "Through the activator: the part that came through it.",
                "short",
                [
                    Target(f"sum({select('qproxy_autoscaler_average_concurrency')})", "in the queue-proxy"),
                    Target(
                        f"sum({select('qproxy_autoscaler_average_proxied_concurrency')})",
                        "through the activator",
                    ),
                ],
            ),
            Panel(
                "Requests per second as the autoscaler sees it",
                "Requests that arrived in the latest reporting window, per second, as reported to the autoscaler.",
                "reqps",
                [
                    Target(f"sum({select('qproxy_autoscaler_requests_per_second')})", "arrived"),
                    Target(
                        f"sum({select('qproxy_autoscaler_proxied_requests_per_second')})",
                        "through the activator",
                    ),
                ],
            ),
        ],
    ),
    Row(
        "The queue (containerConcurrency)",
        [
            Panel(
                "Requests in the queue-proxy (queue depth)",
                "Requests in the breaker, queued or at the app, as of each admitted request (Knative's gauge: "
                "it keeps its last value when requests stop). Classic Knative: revision_queue_depth; current: "
                "kn_serving_queue_depth.",
                "short",
                [
                    Target(
                        either(
                            f"max by (pod) ({select('revision_queue_depth')})",
                            f"max by (pod) ({select('kn_serving_queue_depth')})",
                        ),
                        "{{pod}}",
                    )
                ],
                width=8,
            ),
            Panel(
                "Time in the queue",
                "How long requests waited for a slot (zero when one was free); requests refused with a 503 "
                "are not counted.",
                "s",
                [Target(quantile(q, "qproxy_queue_wait_seconds_bucket"), f"p{round(q * 100)}") for q in (0.5, 0.99)]
                + [
                    Target(
                        f"sum(rate({select('qproxy_queue_wait_seconds_sum')}[{WINDOW}])) / "
                        f"sum(rate({select('qproxy_queue_wait_seconds_count')}[{WINDOW}]))",
                        "mean",
                    )
                ],
                width=8,
            ),
            Panel(
                "503s from a full queue, per second",
                "Requests the queue-proxy refused because its queue was full (its 503s less the app's own).",
                "reqps",
                [
                    Target(
                        either(
                            full_queue(CLASSIC_IN, CLASSIC_APP, CLASSIC_CODE),
                            full_queue(CURRENT_IN, CURRENT_APP, CURRENT_CODE),
                        ),
                        "refused",
                    )
                ],
                width=8,
            ),
        ],
    ),
    Row(
        "Start-up",
        [
            Panel(
                "Start-up: the app's readiness and its first request",
                "Seconds from qproxy's start to the app's first passed readiness check, and to the app's "
                "first answered request, per pod.",
                "s",
                [
                    Target(f"max by (pod) ({select('qproxy_startup_app_ready_seconds')})", "{{pod}} ready"),
                    Target(
                        f"max by (pod) ({select('qproxy_startup_first_request_seconds')})",
                        "{{pod}} first request",
                    ),
                ],
                width=24,
            ),
        ],
    ),
    Row(
        "Adaptive concurrency (where it is on)",
        [
            Panel(
                "Adaptive concurrency limit",
                "The limit qproxy found from the app's latency, per pod (option adaptive-concurrency).",
                "short",
                [Target(f"max by (pod) ({select('qproxy_adaptive_concurrency_limit')})", "{{pod}}")],
            ),
            Panel(
                "The app's unloaded latency (adaptive concurrency)",
                "The latency the limit measures against: the app's, unloaded.",
                "s",
                [Target(f"max by (pod) ({select('qproxy_adaptive_concurrency_unloaded_seconds')})", "{{pod}}")],
            ),
        ],
    ),
]


def panels():
    """Every panel, in the dashboard's order."""
    return [p for row in ROWS for p in row.panels]


# ---- the Grafana JSON model ----------------------------------------------------

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def variable(name, label, query):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "current": {},
        "options": [],
        "includeAll": False,
        "multi": False,
        "hide": 0,
    }


def panel_json(panel, ident, x, y, height):
    fields = {"defaults": {"unit": panel.unit, "min": 0}, "overrides": []}
    out = {
        "id": ident,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": fields,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": t.expr,
                "legendFormat": t.legend,
                "range": panel.kind != "stat",
                "instant": panel.kind == "stat",
            }
            for i, t in enumerate(panel.targets)
        ],
    }
    if panel.kind == "stat":
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "value_and_name",
            "colorMode": "none",
        }
    else:
        fields["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never"}
        out["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        }
    return out


def grafana():
    """The dashboard as Grafana's JSON model: a datasource variable, the
    namespace and revision variables, a row per concern."""
    out, ident, y = [], 1, 0
    for row in ROWS:
        out.append(
            {
                "id": ident,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        ident, y, x = ident + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            out.append(panel_json(panel, ident, x, y, 8))
            ident, x = ident + 1, x + panel.width
        y += 8
    return {
        "uid": UID,
        "title": TITLE,
        "description": "One Knative revision's queue-proxy, Knative's or qproxy: requests, latency, "
        "concurrency as the autoscaler sees it, the queue, start-up, adaptive concurrency. "
        "Knative's families in both generations; qproxy's own panels stay empty with Knative's queue-proxy.",
        "tags": ["knative", "qproxy"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                variable("namespace", "Namespace", 'label_values(up{revision!=""}, namespace)'),
                variable("revision", "Revision", 'label_values(up{namespace="$namespace", revision!=""}, revision)'),
            ]
        },
        "panels": out,
    }


def text():
    """The dashboard's file, as deploy/dashboards/ has it."""
    return json.dumps(grafana(), indent=2, ensure_ascii=False) + "\n"


FILE = os.path.join(ROOT, "deploy", "dashboards", "qproxy-revision.json")


def main():
    """Writes deploy/dashboards/qproxy-revision.json from the panels'
    definitions (tools/qproxy_tools/dashboard/panels.py); --check fails
    instead if the file differs."""
    parser = arguments.parser("deploy/dashboards/generate.py", inspect.cleandoc(main.__doc__))
    parser.add_argument("--check", action="store_true", help="fail if the file is not what would be written")
    args = parser.parse_args()
    want = text()
    if args.check:
        with open(FILE) as f:
            if f.read() != want:
                print(f"{os.path.relpath(FILE, ROOT)} is not its panels' JSON: run deploy/dashboards/generate.py")
                return 1
        return 0
    with open(FILE, "w") as f:
        f.write(want)
    print(os.path.relpath(FILE, ROOT))
    return 0
