"""The chaos scenarios (``tests/chaos``) as a Markdown table for the Reliability docs page.

``python -m benchmarks.chaos [--rounds N] [--socket-timeout S ...] [--scenario TEXT]``

Each scenario runs ``--rounds`` times per socket timeout on a 2-shard topology (1 replica each,
3 sentinels) with real network faults (``LocalSentinelCluster(faults=True)``); a row sums the
errors and lost writes over its rounds and gives the worst longest call and recovery time.
Recovery is from the heal to the first successful write on the faulted shard.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# The scenarios live with the tests; this script runs them from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentinel_cache.testing import LocalSentinelCluster  # noqa: E402
from tests.chaos.history import Report  # noqa: E402
from tests.chaos.scenarios import SCENARIOS, TOPOLOGY, run_scenario, settle  # noqa: E402


def row(scenario: str, socket_timeout: float, reports: Sequence[Report]) -> str:
    errors = sum(r.errors for r in reports)
    longest = max(r.longest for r in reports)
    recoveries = [r.recovery for r in reports if r.recovery is not None]
    recovery = f"{max(recoveries) * 1000:.0f} ms" if recoveries else "-"
    lost = sum(r.lost for r in reports)
    acked = sum(r.acked for r in reports)
    over = sum(len(r.over_bound) for r in reports)
    refused = sum(r.refused for r in reports)
    unseen = sum(bool(r.unconfirmed) for r in reports)
    flags = [f"{over} calls over bound"] if over else []
    flags += [f"{refused} writes refused"] if refused else []
    flags += [f"fault not seen in {unseen} rounds"] if unseen else []
    flag = f" ({', '.join(flags)})" if flags else ""
    return (
        f"| {scenario} | {socket_timeout:g} s | {len(reports)} | {errors} | "
        f"{longest:.3f} s{flag} | {recovery} | {lost} of {acked} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds per scenario (default 1)")
    parser.add_argument(
        "--socket-timeout",
        type=float,
        action="append",
        help="SOCKET_TIMEOUT in seconds (repeatable; default 1)",
    )
    parser.add_argument("--scenario", help="only scenarios whose name contains this text")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every round")
    args = parser.parse_args(argv)
    timeouts = args.socket_timeout or [1.0]
    chosen = [s for s in SCENARIOS if args.scenario is None or args.scenario in s]
    if not chosen:
        parser.error(f"no scenario matches {args.scenario!r}")
    lines = [
        "| Scenario | SOCKET_TIMEOUT | Rounds | Errors | Longest blocked call | Recovery time "
        "| Acknowledged writes lost |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    began = time.monotonic()
    with LocalSentinelCluster(**TOPOLOGY) as cluster:
        print(f"# chaos scenarios on {cluster!r}", file=sys.stderr)
        for scenario in chosen:
            for socket_timeout in timeouts:
                reports = []
                for n in range(args.rounds):
                    settle(cluster)
                    report = run_scenario(scenario, cluster, socket_timeout=socket_timeout)
                    report.history.clear()  # judged; kept calls would grow GC pauses
                    reports.append(report)
                    if args.verbose:
                        print(f"round {n + 1}: {report.summary()}", file=sys.stderr)
                lines.append(row(scenario, socket_timeout, reports))
                print(lines[-1], file=sys.stderr)
    print("\n".join(lines))
    print(
        f"\n{cluster.server_kind} {cluster.server_version}, {time.monotonic() - began:.0f} s in all."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
