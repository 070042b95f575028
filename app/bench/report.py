"""The table `pipeline bench` prints: each figure beside its reference from the same run."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

REPLAY_TARGET_PER_S = 20_000


def _load(figures: dict[str, Any]) -> str:
    return (
        f"{figures['requests_per_s']:,.0f} req/s · p50 {figures['p50_ms']:.1f} ms · "
        f"p99 {figures['p99_ms']:.1f} ms"
        + (f" · {figures['non_2xx']} non-2xx" if figures["non_2xx"] else "")
        + _cpu(figures.get("cpu_ms_per_request"), "request")
    )


def _cpu(per: dict[str, float] | None, unit: str) -> str:
    """The CPU each process spent per `unit`, as measured beside a rate ("" when not)."""
    if not per:
        return ""
    spent = ", ".join(f"{name} {ms:.3g} ms" for name, ms in per.items())
    return f" · CPU per {unit}: {spent}"


def _latencies(figures: dict[str, Any]) -> str:
    return f"p99 {figures['p99_ms']:.1f} ms · p50 {figures['p50_ms']:.1f} ms"


def _ratio(ours: float, reference: float) -> str:
    return f"{ours / reference:.2f}x" if reference else "-"


def rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(scenario, ours, reference, ratio) for each row of the table."""
    found: list[tuple[str, str, str, str]] = []
    intake = figures.get("intake")
    if intake:
        ours, naive, bare = intake["ours"], intake["naive"], intake["bare"]
        found.append(
            (
                f"intake: signed, journaled, bounded (c={intake['concurrency']})",
                _load(ours),
                "naive: " + _load(naive),
                _ratio(ours["requests_per_s"], naive["requests_per_s"]),
            )
        )
        found.append(
            (
                "intake beside a bare 202-only endpoint",
                f"{ours['requests_per_s']:,.0f} req/s",
                "bare: " + _load(bare),
                _ratio(ours["requests_per_s"], bare["requests_per_s"]),
            )
        )
    e2e = figures.get("end_to_end")
    if e2e:
        found.append(
            (
                f"end to end: {e2e['records']:,} records, intake → done ({e2e['pool']}; "
                f"default settings, up to {e2e['batch_size']} records to a message)",
                f"{e2e['ours_records_per_s']:,.0f} records/s"
                + _cpu(e2e.get("ours_cpu_ms_per_record"), "record"),
                f"bare Celery no-op drain: {e2e['celery_noop_per_s']:,.0f} tasks/s"
                + _cpu(e2e.get("celery_noop_cpu_ms_per_record"), "task"),
                _ratio(e2e["ours_records_per_s"], e2e["celery_noop_per_s"]),
            )
        )
        found.append(
            (
                "end to end, one record to a message (batch_size=1)",
                f"{e2e['ours_single_records_per_s']:,.0f} records/s"
                + _cpu(e2e.get("ours_single_cpu_ms_per_record"), "record"),
                f"bare Celery no-op drain: {e2e['celery_noop_per_s']:,.0f} tasks/s",
                _ratio(e2e["ours_single_records_per_s"], e2e["celery_noop_per_s"]),
            )
        )
    found += _delivery_rows(figures)
    found += _fair_shares_rows(figures)
    replay = figures.get("replay")
    if replay:
        found.append(
            (
                f"replay: {replay['rows']:,} journal rows re-enqueued",
                f"{replay['records_per_s']:,.0f} records/s ({replay['seconds']:.1f} s)"
                + _cpu(replay.get("cpu_ms_per_record"), "record"),
                f"target: {REPLAY_TARGET_PER_S:,} records/s",
                _ratio(replay["records_per_s"], REPLAY_TARGET_PER_S),
            )
        )
    found += _journal_rows(figures)
    found += _error_search_rows(figures)
    isolation = figures.get("isolation")
    if isolation:
        alone, flooded, busy = isolation["alone"], isolation["flooded"], isolation["busy"]
        found.append(
            (
                f"isolation's floor: order p99 beside {isolation['busy_loops']} busy loops at "
                "the lowest CPU priority (no flood)",
                _latencies(busy),
                "alone: " + _latencies(alone),
                _ratio(busy["p99_ms"], alone["p99_ms"]),
            )
        )
        found.append(
            (
                "isolation: order p99 intake → done, status flooded "
                f"({isolation['status_records_posted']:,} posted)",
                _latencies(flooded)
                + _cpu(isolation.get("flooded_cpu_ms_per_record"), "status record"),
                "alone: " + _latencies(alone),
                _ratio(flooded["p99_ms"], alone["p99_ms"]),
            )
        )
        paced, posted = isolation["paced"], isolation["paced_status_records_posted"]
        found.append(
            (
                "isolation, the status line's INTAKE_RATE at "
                f"{isolation['paced_intake_rate']:,}/s ({posted:,} posted)",
                _latencies(paced),
                "alone: " + _latencies(alone),
                _ratio(paced["p99_ms"], alone["p99_ms"]),
            )
        )
        split = isolation.get("split")
        if split:
            found.append(
                (
                    "isolation, the status line on an intake of its own, it and its worker at "
                    f"nice 19 ({isolation['split_status_records_posted']:,} posted; "
                    "target: p99 at most 1.3x the floor's)",
                    _latencies(split),
                    "the floor: " + _latencies(busy),
                    _ratio(split["p99_ms"], busy["p99_ms"]),
                )
            )
    for name, memory in figures.get("memory", {}).items():
        found.append(
            (
                f"RSS of the {name} during its scenario",
                f"{memory['first_mib']:.0f} → peak {memory['peak_mib']:.0f} → "
                f"{memory['last_mib']:.0f} MiB",
                "first → peak → last sample",
                _ratio(memory["last_mib"], memory["first_mib"]),
            )
        )
    return found


def _delivery_rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Delivery to a downstream at each delay: ours (drained, and end to end) beside plain
    Celery tasks posting the same bodies."""
    found: list[tuple[str, str, str, str]] = []
    for run in figures.get("delivery", {}).get("runs", []):
        counts = run.get("downstream", {})
        once = (
            "each record once"
            if run["each_once"]
            else "NOT each record exactly once (see the downstream's counts)"
        )
        found.append(
            (
                f"delivery: {run['records']:,} records to a downstream answering in "
                f"{run['delay_ms']} ms (ours: the line's defaults, "
                f"{run.get('ours_pool', 'concurrency ' + str(run['concurrency']))}, "
                f"batch size {run['batch_size']}; the downstream alone: "
                f"{run['downstream_alone_per_s']:,.0f} req/s at "
                f"c={run['downstream_alone_connections']})",
                f"drain {run['ours_drain_records_per_s']:,.1f} records/s · end to end "
                f"{run['ours_e2e_records_per_s']:,.1f} records/s · at most "
                f"{run['ours_max_in_flight']} in flight · {once}"
                + _cpu(counts.get("ours_drain", {}).get("cpu_ms_per_record"), "record drained"),
                f"plain Celery (prefork {run['concurrency']}): "
                f"{run['plain_records_per_s']:,.1f} records/s · at most "
                f"{run['plain_max_in_flight']} in flight"
                + _cpu(counts.get("plain", {}).get("cpu_ms_per_record"), "record"),
                _ratio(run["ours_drain_records_per_s"], run["plain_records_per_s"]),
            )
        )
        if "plain_same_records_per_s" in run:
            found.append(
                (
                    f"delivery at the same process count, {run['delay_ms']} ms: ours "
                    f"({run.get('ours_pool', '')}) beside plain Celery with as many processes "
                    f"({run['plain_same_records']:,} tasks)",
                    f"drain {run['ours_drain_records_per_s']:,.1f} records/s",
                    f"plain Celery (prefork {run['plain_same_processes']}): "
                    f"{run['plain_same_records_per_s']:,.1f} records/s · at most "
                    f"{run['plain_same_max_in_flight']} in flight"
                    + _cpu(counts.get("plain_same", {}).get("cpu_ms_per_record"), "record"),
                    _ratio(run["ours_drain_records_per_s"], run["plain_same_records_per_s"]),
                )
            )
    return found


def _fair_shares_rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Shop B's orders beside shop A's flood on the same line, each beside itself alone."""
    shares = figures.get("fair_shares")
    if not shares:
        return []
    alone, beside = shares["b_alone"], shares["b_beside_a"]
    flood, late = shares["flood_records"], shares["late_records"]
    waiting = ", ".join(f"{n:,}" for n in shares["a_not_done_when_b_began"])
    rounds = shares["rounds"]
    of = f"{rounds} rounds; " if rounds > 1 else ""
    return [
        (
            f"fair shares: shop B's {late} orders one every {shares['late_interval_ms']} ms, "
            f"intake → done, after shop A posted {flood:,} at once ({of}fair share "
            f"{shares['fair_share']}; of A's, {waiting} not done when B began; target: p99 "
            "at most 2x alone)",
            _latencies(beside) + f" · max {beside['max_ms']:.1f} ms",
            "B alone: " + _latencies(alone) + f" · max {alone['max_ms']:.1f} ms",
            _ratio(beside["p99_ms"], alone["p99_ms"]),
        ),
        (
            f"fair shares: shop A's {flood:,} orders at once, first post → last done, "
            f"beside shop B's {late} ("
            + (f"the median of {rounds} rounds; " if rounds > 1 else "")
            + "target: at most 10 % lower than alone)",
            f"{shares['a_beside_b_records_per_s']:,.0f} records/s "
            f"({shares['a_change_pct']:+.1f} %)",
            f"A alone: {shares['a_alone_records_per_s']:,.0f} records/s",
            _ratio(shares["a_beside_b_records_per_s"], shares["a_alone_records_per_s"]),
        ),
    ]


def _journal_rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The intake beside the status routes' pollers, and beside retention."""
    found: list[tuple[str, str, str, str]] = []
    polled = figures.get("polled")
    if polled:
        alone, beside = polled["alone"], polled["polled"]
        found.append(
            (
                f"intake beside {polled['pollers']} pollers of /v1/lines and /metrics "
                f"({polled['rows']:,}-row journal; {polled['polls_per_s']:,.0f} polls/s"
                + (f", {polled['polls_not_ok']} not 200" if polled["polls_not_ok"] else "")
                + ")",
                _load(beside),
                "no pollers: " + _load(alone),
                _ratio(beside["p99_ms"], alone["p99_ms"]),
            )
        )
    retention = figures.get("retention")
    if retention:
        alone, during = retention["alone"], retention["during"]
        found.append(
            (
                f"retention: {retention['deleted']:,} expired records deleted in one run, "
                "the intake under load",
                f"{retention['rows_per_s']:,.0f} rows/s ({retention['seconds']:.1f} s)",
                f"the intake's rate: {alone['requests_per_s']:,.0f} records/s",
                _ratio(retention["rows_per_s"], alone["requests_per_s"]),
            )
        )
        found.append(
            (
                "intake during the retention purge",
                _load(during),
                "no purge: " + _load(alone),
                _ratio(during["p99_ms"], alone["p99_ms"]),
            )
        )
    return found


# The error search's rows: its figures' names, and what each row measured.
ERROR_SEARCHES = {
    "rare_oldest": "rare word, one page, oldest first",
    "rare_newest": "rare word, one page, newest first",
    "rare_to_end": "rare word, every page",
    "rare_line_dead": "rare word + line + status=dead, every page",
    "common_first_page": "common word, first page",
}
# The row of a bulk retry's dry run (its count).
ERROR_SEARCH_DRY_RUN = "bulk dry run, rare word + line + status=dead"


def _error_search_rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """`GET /v1/records?error=…` on a large journal: each search's median beside a page of
    the same journal without an error filter; the bulk dry run's count."""
    search = figures.get("error_search")
    if not search:
        return []
    journal = (
        f"{search['rows']:,} records, {search['with_error']:,} with an error, "
        f"pages of {search['page']}"
    )
    plain = search["no_error_filter"]
    reference = (
        "no error filter (line + status, newest first), one page: median "
        f"{plain['median_ms']:.1f} ms · {plain['found']} found"
    )
    found: list[tuple[str, str, str, str]] = []
    for name, what in ERROR_SEARCHES.items():
        run = search[name]
        found.append(
            (
                f"error search: {what} ({journal})",
                f"median {run['median_ms']:.1f} ms of {search['runs']} · {run['found']} found "
                f"in {run['pages']} page(s)",
                reference,
                _ratio(run["median_ms"], plain["median_ms"]),
            )
        )
    dry = search["dry_run"]
    found.append(
        (
            f"error search: {ERROR_SEARCH_DRY_RUN} ({journal})",
            f"median {dry['median_ms']:.1f} ms of {search['runs']} · {dry['matched']} "
            f"matched, {dry['acted']} to retry",
            reference,
            _ratio(dry["median_ms"], plain["median_ms"]),
        )
    )
    return found


def print_table(figures: dict[str, Any], console: Console) -> None:
    table = Table("scenario", "ours", "reference (same run)", "ratio", title="pipeline bench")
    for row in rows(figures):
        table.add_row(*row)
    console.print(table)
    machine = figures.get("machine", {})
    console.print(
        f"{machine.get('cpus')} CPUs · Python {machine.get('python')} · "
        f"journal: {machine.get('database')} · load generator: {machine.get('load_generator')}"
        + (" · quick run" if machine.get("quick") else "")
    )
