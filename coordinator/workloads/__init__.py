"""The demo's workloads: local Spark and Flink clusters (sparkcluster, flinkcluster, processes) and the
Yahoo Streaming Benchmark on both engines (ysb/). Imports only the host agent's parsers, nothing else
of the coordinator.
"""
