"""Bring home what a run left on its hosts (``coordinator fetch RUN``): after the coordinator was killed,
or lost a host for longer than its reconnect window, the host profilers finish their window on their own
and keep the capture in their work directory, which run.json names.

Each such host is reached again, its profiler waited for (never beyond the window's end plus the finish
grace: then it is stopped), its capture fetched, and its work directory removed; run.json is completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from coordinator import rundir
from coordinator.remote import deploy
from coordinator.remote.cluster import HostSpec, load_cluster
from coordinator.remote.hosts import HostTransport, run_request
from coordinator.remote.progress import ProgressBoard, make_renderer
from coordinator.remote.session import LOG_FILE, TransportFactory
from coordinator.remote.worker import HostWorker, RunContext, RunControl, RunLog
from coordinator.rundir import HostOutcome, RunInfo
from profiler.errors import CaptureFormatError, OutputExistsError


@dataclass(frozen=True)
class FetchOutcome:
    info: RunInfo
    fetched: tuple[str, ...]  # hosts whose work directory was visited


class RecoveryWorker(HostWorker):
    """A HostWorker that takes over a work directory instead of deploying: wait, fetch, clean up."""

    def __init__(
        self, transport: HostTransport, context: RunContext, previous: HostOutcome, start_at: float | None
    ) -> None:
        super().__init__(transport, context)
        self.outcome = replace(previous, address=transport.address)
        self.start_at = start_at

    def _run(self) -> None:
        transport = self.transport
        self._phase("connecting")
        transport.connect()
        transport.attach(self.outcome.workdir)
        transport.clock_offset = self.outcome.clock_offset or 0.0
        if self.outcome.has_capture:  # fetched before; only the clean-up was missing
            self._phase("cleaning up")
            return
        self._phase("waiting", "for the profiler to finish its window")
        status = self._watch(self.start_at or self.clock.time())  # TransportLost: the host stays "failed"
        self._collect(status)


def _check_destinations(run_dir: Path, labels: list[str]) -> None:
    """Before any host is reached: each capture lands in RUN/hosts/<host>/, which must be a directory of the
    run's own (or not yet there), never a link or a file that would send the extracted files elsewhere."""
    hosts_dir = run_dir / rundir.HOSTS_DIR
    for path in (hosts_dir, *(rundir.host_capture_dir(run_dir, label) for label in labels)):
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            kind = "a symbolic link" if path.is_symlink() else "not a directory"
            raise OutputExistsError(
                f"{path}: is {kind}; `coordinator fetch` writes the host's capture there: move it away and run "
                "fetch again"
            )


def fetch_run(
    run_dir: Path,
    factory: TransportFactory,
    finish_grace: float | None = None,
    progress: bool = True,
    everything: bool = False,
) -> FetchOutcome:
    """Recover every host of ``run_dir`` whose run.json entry still names a work directory."""
    run_dir = Path(run_dir)
    info = rundir.read_run(run_dir)
    pending = [h for h in info.hosts if h.workdir]
    if not pending:
        return FetchOutcome(info, ())
    for host in pending:
        try:
            deploy.check_workdir(host.workdir)
        except ValueError:
            raise CaptureFormatError(
                f"{run_dir / rundir.RUN_FILE}: host {host.host}: workdir {host.workdir!r} is not a work directory "
                "the coordinator creates; fix or remove that field"
            ) from None
    _check_destinations(run_dir, [h.host for h in pending])
    specs = _specs_by_label(run_dir, [h.host for h in pending])
    request = run_request(
        info.duration,
        run_dir / rundir.PROFILE_COPY,
        run_dir / rundir.PROFILE_COPY,  # known_spes: not used, nothing is deployed
        fetch_all=everything,
        frequency=info.frequency,
    )
    grace = max(60.0, 0.25 * info.duration) if finish_grace is None else finish_grace
    board = ProgressBoard([h.host for h in pending])
    renderer = make_renderer(progress, None)
    log = RunLog(run_dir / LOG_FILE)
    control = RunControl()
    control.go.set()
    context = RunContext(request, run_dir, control, board, log, grace)
    workers = [RecoveryWorker(factory(specs[h.host]), context, h, info.start_time) for h in pending]
    renderer.start()
    # Ctrl-C here leaves everything as it was: the profilers run on, run.json still names their
    # work directories, and the next `coordinator fetch` takes over.
    try:
        for worker in workers:
            log.write(worker.spec.label, f"fetch: taking over {worker.outcome.workdir}")
            worker.start()
        while any(w.is_alive() for w in workers):
            renderer.refresh(board)
            for worker in workers:
                worker.join(0.2 / len(workers))
    finally:
        renderer.stop(board)
        log.close()
    recovered = {w.spec.label: w.outcome for w in workers}
    hosts = tuple(recovered.get(h.host, h) for h in info.hosts)
    info = info.with_hosts(hosts)
    rundir.write_run(run_dir, info)
    return FetchOutcome(info, tuple(recovered))


def _specs_by_label(run_dir: Path, labels: Sequence[str]) -> dict[str, HostSpec]:
    """The hosts as the run reached them: from the run's copy of cluster.txt."""
    copy = run_dir / rundir.CLUSTER_COPY
    specs = {spec.label: spec for spec in load_cluster(copy)}
    missing = [label for label in labels if label not in specs]
    if missing:
        raise CaptureFormatError(
            f"{copy}: no entry for host(s) {', '.join(missing)} named in {run_dir / rundir.RUN_FILE}; "
            "restore the run's cluster.txt copy"
        )
    return specs


__all__ = ["FetchOutcome", "fetch_run"]
