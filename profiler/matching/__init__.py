"""Application profiles and the leaf-first matching of stacks to tasks: the profile format (appprofile),
the matcher (matcher, the same code on the host and in the coordinator's PySpark pipeline), the rows
per PID and task (aggregate) and their confidence intervals (stats).

Pure processing: imports only profiler.capture and profiler.errors, never sampling (contract
`profiler-pure-rooms`).
"""
