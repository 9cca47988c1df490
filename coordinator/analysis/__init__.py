"""The analysis of captures: typed inputs (inputs), summary rows (rows), run comparison (compare), the
time axis (timeline) and the engines that match stacks to tasks, on Spark or in this process (engines).
"""
