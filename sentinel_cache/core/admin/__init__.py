"""Operator tools on top of the topology and the operations: status, health, resharding."""
