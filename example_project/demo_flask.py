"""``make demo``'s Flask step: the example Flask app on the same topology (``@cache.cached``,
``@cache.memoize``, ``flask sentinel-status``)."""

from __future__ import annotations

import time
from typing import Any

from example_project.demo_tools import DemoFailure


def flask(demo: Any) -> None:
    """The step, on the running demo."""
    from django.core.cache import cache

    from example_project.flask_app import backend, create_app

    demo.out.step("The Flask app: @cache.cached, @cache.memoize, flask sentinel-status")
    app = create_app()
    client = app.test_client()
    with app.app_context():
        shared = backend().core is cache.core  # type: ignore[attr-defined]
    demo.out.say(
        "Flask-Caching backend built from CACHE_REDIS_SENTINELS; "
        + ("it shares the Django cache's core (equal settings)" if shared else "own core")
    )
    first, second = client.get("/report").get_json(), client.get("/report").get_json()
    demo.out.say(
        f"/report (@cache.cached): generated {first['generated_at']}, then {second['generated_at']}"
    )
    if first != second:
        raise DemoFailure("@cache.cached did not serve the second /report")
    timings = []
    for _ in range(2):
        started = time.perf_counter()
        result = client.get("/square/12").get_json()
        timings.append((time.perf_counter() - started) * 1000)
    demo.out.say(
        f"/square/12 (@cache.memoize): {result['square']}, {timings[0]:.0f} ms then "
        f"{timings[1]:.0f} ms"
    )
    if timings[1] > timings[0]:
        raise DemoFailure("@cache.memoize did not make the second call faster")
    shards = [0] * len(demo.masters)
    for n in range(200):
        response = client.get(f"/visit/{n}")
        if response.status_code != 200:
            raise DemoFailure(f"Flask /visit/{n} answered {response.status_code}")
        shards[response.get_json()["shard"]] += 1
    demo.out.say(f"/visit/0..199: all stored and read back; per shard {shards}")
    status = client.get("/shards").get_json()
    name, new = demo.switched
    flask_view = {s["name"]: s["address"] for s in status["shards"]}
    demo.out.say(f"/shards: {flask_view}")
    if flask_view[name] != new:
        raise DemoFailure(f"the Flask app sees {name} at {flask_view[name]}, expected {new}")
    runner = app.test_cli_runner()
    result = runner.invoke(args=["sentinel-status"])
    # Exit 1 (degraded) can come back for a moment while the sentinels are still
    # reconfiguring the old master as a replica, 10-20 s after the failover.
    started, deadline = time.monotonic(), time.monotonic() + 20
    if result.exit_code == 1:
        problems = [r.strip() for r in result.output.splitlines() if r.startswith("  - ")]
        demo.out.say(
            f"flask sentinel-status: exit 1 for now ({problems[0] if problems else '?'}); "
            "waiting up to 20s: the sentinels are still settling after the failover"
        )
    while result.exit_code == 1 and time.monotonic() < deadline:
        time.sleep(0.25)
        result = runner.invoke(args=["sentinel-status"])
    waited = time.monotonic() - started
    demo.out.say(
        f"flask sentinel-status: exit {result.exit_code}"
        + (f" (after {waited:.1f}s)" if waited > 0.1 else "")
    )
    if result.exit_code != 0:
        demo.out.block(result.output)
        raise DemoFailure(f"flask sentinel-status exited {result.exit_code}")
