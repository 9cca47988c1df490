"""The cluster side of the coordinator: cluster.txt (cluster), the local and SSH transports (hosts, ssh),
the agent bundle and remote shell lines (deploy), a profile session from deploy to report (session) with
one thread per host (worker), fetching and recovering captures later (recover) and progress lines (progress).

Imports the report, the analysis and run directories below it; never the commands.
"""
