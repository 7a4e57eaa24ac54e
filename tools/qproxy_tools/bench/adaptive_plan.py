"""What the adaptive benchmark runs: its contenders, the limiter's bounds,
the knees and rates of its loads, and its open runs in the order they
run."""

CONTENDERS = ("direct", "qproxy", "qproxy-adaptive")
# The limiter's bounds (docs/options.md).
LIMIT_BOUNDS = (1, 1000)
# The open load's rates, times the app's capacity, and the knees it runs
# against.
RATES = (0.5, 1.0, 1.5)
# A rate at which the queue behind the limit fills within a run (10,000
# requests more than the app serves): with the option only, since without
# it nothing queues in qproxy.
OVERFLOW = 4.0
OPEN_KNEES = (0, 64)
# The connections that measure the app's capacity: few enough that the
# app holds next to nothing, enough to keep its core busy.
CAPACITY_CONNECTIONS = 4


def path(args, knee):
    """The app's URL path for `knee`, at the run's work per request."""
    return f"/contended?work={args.work}&knee={knee}"


def open_runs(args):
    """(rate factor, contender) of each open run, in order."""
    runs = [(factor, name) for factor in args.rates for name in ("qproxy", "qproxy-adaptive")]
    return runs + ([(args.overflow, "qproxy-adaptive")] if args.overflow else [])


def knee_name(knee):
    return "none" if knee == 0 else str(knee)
