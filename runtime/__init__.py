"""The loops a board runtime performs (window walks, stateful streams, KV buckets) over any backend."""
