"""The Yahoo Streaming Benchmark (YSB) on Spark Structured Streaming: generator, pipeline, Redis sink.

``app.py`` is the PySpark application submitted with spark-submit; ``runner.py`` runs it on a
LocalSparkCluster for the demo and the benchmarks.
"""
