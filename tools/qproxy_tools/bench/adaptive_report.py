"""What the adaptive benchmark reports: its section of benches/RESULTS.md
(the closed and open loads' tables, the goodput gained against what the
app's cost model predicts), and what its smoke fails on."""

from .adaptive_plan import CAPACITY_CONNECTIONS, CONTENDERS, LIMIT_BOUNDS, OVERFLOW, knee_name, open_runs
from .installs import VEGETA_VERSION
from .pages import RESULTS, write_section
from .stats import med

BEGIN, END = "<!-- adaptive:begin -->", "<!-- adaptive:end -->"


def ms(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds is not None else "–"


def problems(results):
    """What the smoke fails on: an error with any contender (a 503 past a
    full queue included, which no load below capacity may meet), or a
    limit that was never read or is out of the limiter's bounds."""
    found = []
    for knee, by_name in results["closed"].items():
        for name, rounds in by_name.items():
            for r in rounds:
                if r["errors"]:
                    found.append(f"closed, knee {knee}, {name}: {r['errors']} errors")
                if name == "qproxy-adaptive" and not (
                    r.get("limit") is not None and LIMIT_BOUNDS[0] <= r["limit"] <= LIMIT_BOUNDS[1]
                ):
                    found.append(f"closed, knee {knee}: the limit {r.get('limit')} is not within {LIMIT_BOUNDS}")
    for knee, by_load in results["open"].items():
        for (factor, name), rounds in by_load.items():
            for r in rounds:
                if r["errors"] or (factor < 1 and r["shed"]):
                    found.append(
                        f"open, knee {knee}, {factor}× capacity, {name}: {r['errors']} errors, {r['shed']} 503s"
                    )
    return found


def section(args, facts, results):
    """The section, between its markers, for `results` (`adaptive.run`'s)
    of a run with `args` whose facts are `facts`."""
    lines = [
        BEGIN,
        "## Adaptive concurrency under overload (`benches/adaptive.py`)",
        "",
        f"{facts}: `benches/adaptive.py`, {args.rounds} rounds of {args.seconds} s per load, medians.",
        "",
        f"The app (`benches/app`'s `/contended?work={args.work}&knee=K`) does {args.work:,} rounds of arithmetic "
        "per request, times (1 + held/K), held being the requests inside it at arrival, yielding as threads "
        "would: its CPU per request grows with what it holds, as an app's does under contention, the more the "
        "smaller K is; with K none its cost does not grow. That growth is the premise: it is what a limit can "
        "win back, and without it there is nothing to win. The app runs alone on CPU 1; qproxy and the load "
        "share CPU 0. `qproxy` is a revision without `containerConcurrency` as Knative runs it (no limit); "
        "`qproxy-adaptive` the same with `qproxy-adaptive-concurrency` on. Each round starts one contender "
        "later; the first seconds (the limit learning) are measured.",
        "",
        f"**Closed loop**: {args.connections} connections, each sending its next request once answered (wrk). "
        "In a closed loop the clients wait for their answers, so latency is the connections over goodput "
        "(Little's law): p99 says little that goodput does not.",
        "",
        "| knee | contender | goodput (2xx/s) | p50 | p99 | errors | limit at the end |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    gains = []
    for knee, by_name in results["closed"].items():
        for name in CONTENDERS:
            rounds = by_name[name]
            limit = med(rounds, "limit")
            lines.append(
                f"| {knee_name(knee)} | `{name}` | {med(rounds, 'goodput'):,.0f} | {ms(med(rounds, 'p50'))} | "
                f"{ms(med(rounds, 'p99'))} | {sum(r['errors'] for r in rounds)} | "
                f"{f'{limit:.0f}' if limit else '–'} |"
            )
        off, on = med(by_name["qproxy"], "goodput"), med(by_name["qproxy-adaptive"], "goodput")
        limit = med(by_name["qproxy-adaptive"], "limit")
        # What the app's cost model alone predicts: every connection held
        # without the option, the limit's worth with it.
        model = (1 + args.connections / knee) / (1 + limit / knee) if knee and limit else 1.0
        gains.append(f"knee {knee_name(knee)}: {on / off:.2f}× (the model alone: {model:.2f}×)")
    lines += [
        "",
        "Goodput with the option against without it, " + "; ".join(gains) + ". Errors are wrk's: its 2 s "
        "timeout, after which the app still holds the request, so that where they are many the app holds more "
        "than the connections and the model's figure is a floor.",
        "",
    ]
    if results["open"]:
        caps = ", ".join(f"{results['capacity'][k]:,.0f} a second with knee {knee_name(k)}" for k in results["open"])
        lines += [
            "**Open loop**: requests at fixed rates, sent whatever the answers' latency (vegeta "
            f"{VEGETA_VERSION}, on CPU 0 with qproxy, 30 s timeout), at fractions of the app's capacity ({caps}: "
            f"the app alone, {CAPACITY_CONNECTIONS} connections), {args.open_rounds} round(s) of {args.seconds} s, "
            "each with a fresh app, once the last run's connections have left TIME-WAIT. `sent/s` is what the "
            "generator managed: below the rate asked, it fell behind "
            "(its core shared, thousands of requests in flight). Goodput is the 2xx answers over the time from the "
            "first request sent to the last answer (a queue still draining after the last request stretches it); "
            "latency is the 2xx answers'; `503` is Knative's "
            "breaker's answer once the queue behind the limit holds 10,000, which the last row, with the option "
            f"only, at {OVERFLOW:g}× capacity, sends enough to fill; other errors are mostly the 30 s timeout.",
            "",
            "| knee | rate asked | contender | sent/s | goodput (2xx/s) | p50 | p99 | 503 | other errors | "
            "limit at the end |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for knee, by_load in results["open"].items():
            cap = results["capacity"][knee]
            for factor, name in open_runs(args):
                rounds = by_load[(factor, name)]
                limit = med(rounds, "limit")
                lines.append(
                    f"| {knee_name(knee)} | {factor:.1f}× ({cap * factor:,.0f}/s) | `{name}` | "
                    f"{med(rounds, 'sent') / args.seconds:,.0f} | {med(rounds, 'goodput'):,.0f} | "
                    f"{ms(med(rounds, 'p50'))} | {ms(med(rounds, 'p99'))} | "
                    f"{sum(r['shed'] for r in rounds)} | {sum(r['errors'] for r in rounds)} | "
                    f"{f'{limit:.0f}' if limit else '–'} |"
                )
        lines.append("")
    lines += ["![goodput and the limit](adaptive.svg)", END]
    return "\n".join(lines) + "\n"


def write(text):
    """Puts the section `text` between RESULTS.md's adaptive markers."""
    write_section(RESULTS, text.rstrip("\n"), BEGIN, END)
