"""Network-fault scenarios (``-m chaos``): partitions, one-way cuts, latency and loss under load,
judged by a Jepsen-style checker (:mod:`history`)."""
