"""Benchmarks of redisbus beside raw redis-py and FastStream (docs/benchmarks.md).

Run ``python -m bench`` (``make bench``): every figure is measured beside its baseline in the
same run, on the same private ``redis-server`` (a free loopback port, no persistence; set
``REDISBUS_BENCH_URL`` to use another server, which is then never flushed), in alternating
rounds; the table shows medians, ratios and each target met or missed with the gap. Results
go to ``bench/results.json`` (not committed) and ``bench/RESULTS.md`` (the table for the
README; a run of some figures, ``--only``, writes ``bench/RESULTS-partial.md`` instead, not
committed, unless ``--md`` names a file; its wake-up plot is named after that table).

``--quick`` small workloads and 2 rounds; ``--only NAME[,NAME]`` some figures (``--list``
names them); ``--full`` (or ``--only memory``) sends 1,000,000 messages in the memory figure
instead of 100,000; ``--rounds N``.

``python -m bench.costs`` prints what one call of each operation costs (wall time, round
trips, commands sent, commands and time on the server): where to look before optimising.

Modules: ``server`` (the Redis server), ``baselines`` (raw redis-py, redis.asyncio,
FastStream), ``cases`` (redisbus, public API only), ``figures`` (which case goes beside which
baseline, and the targets), ``report`` (medians, targets, table, JSON, markdown), ``common``
(run context, payloads, statistics), ``costs`` (the per-call cost sheet).
"""
