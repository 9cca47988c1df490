"""What the stream engines say about themselves over REST: events per window and the Flink and Spark
readers (events), Flink's job vertices, subtasks and metrics (flinkmetrics), Spark's stages, jobs and
codegen plans (sparkplan), with the thread-name parsers the coordinator uses too.

Imports only profiler.capture and profiler.errors.
"""
