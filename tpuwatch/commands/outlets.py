"""--notify, --metrics and --tensorboard of ``run`` and ``attach`` (docs/alerts.md, docs/prometheus.md,
docs/tensorboard.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tpuwatch.commands.lines import say

if TYPE_CHECKING:
    from tpuwatch.console.alerts import Alerts
    from tpuwatch.console.metrics_server import MetricsServer
    from tpuwatch.console.relay import Relay
    from tpuwatch.console.tensorboard_export import TensorBoardExport


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--notify", action="append", default=[], metavar="CMD",
                   help="run shell command CMD on every new warning or critical finding, a stall, a crash and the "
                        "end of the run: the event as JSON on its stdin, TPUWATCH_EVENT_KIND/RULE/SEVERITY/RUN/"
                        "STATUS/MESSAGE in its environment (repeatable; killed after TPUWATCH_NOTIFY_TIMEOUT_S, "
                        "default 10 s; docs/alerts.md)")
    p.add_argument("--notify-min-severity", choices=("info", "warning", "critical"), default="warning",
                   help="the least severe finding --notify sends (default warning); stalls, crashes and the end "
                        "of the run are always sent")
    p.add_argument("--metrics", default="", metavar="HOST:PORT",
                   help="serve the run's numbers on http://HOST:PORT/metrics for Prometheus, from this process "
                        "(HOST defaults to 127.0.0.1: give 127.0.0.1:PORT or just PORT; docs/prometheus.md)")
    p.add_argument("--tensorboard", type=Path, metavar="LOGDIR",
                   help="also write step time, input wait, each replica's loss and memory as TensorBoard scalars "
                        "into LOGDIR/tpuwatch-<run-id> as the run goes (needs the tensorboard package; "
                        "docs/tensorboard.md)")


class Outlets:
    """What the options above ask for: checked before the script starts, fed by a relay (its own
    thread, tailing the recording) while the run is watched, closed after the view."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.relay: Relay | None = None
        self.alerts: Alerts | None = None
        self.metrics: MetricsServer | None = None
        self.tensorboard: TensorBoardExport | None = None
        self._quiet = False  # the dashboard has the terminal: say things after it closes
        self._held: list[str] = []

    def open(self, run_id: str | None = None) -> str:
        """Checks the options (for the run ``run_id`` when it exists already); binds --metrics.
        Returns what is wrong with them ("" when nothing is)."""
        if self.ns.tensorboard is not None:
            from tpuwatch.console import tensorboard_export

            if problem := tensorboard_export.problem(self.ns.tensorboard, run_id):
                return problem
        if self.ns.metrics:
            from tpuwatch.console.metrics_server import MetricsServer

            value = self.ns.metrics
            try:
                self.metrics = MetricsServer.open(f"127.0.0.1:{value}" if value.isdigit() else value)
            except ValueError as e:
                return str(e)
            if not self.metrics.loopback:
                say(f"warning: --metrics {value} serves the run's numbers, without a token, to anyone who can "
                    "reach this machine's port: run id, script name, strategy, devices, steps, losses, memory "
                    "and findings; prefer 127.0.0.1:PORT, with SSH port forwarding for a remote Prometheus "
                    "(docs/prometheus.md)")
        return ""

    def start(self, run_dir: Path, is_alive: Callable[[], bool], *, quiet: bool) -> None:
        from tpuwatch.console.relay import Outlet, Relay, relay_source

        self._quiet = quiet
        outlets: list[Outlet] = []
        if self.ns.notify:
            from tpuwatch.console.alerts import Alerts

            self.alerts = Alerts(self.ns.notify, min_severity=self.ns.notify_min_severity, report=self._report,
                                 run_dir=str(run_dir))
            outlets.append(self.alerts)
        if self.ns.tensorboard is not None:
            from tpuwatch.console import tensorboard_export
            from tpuwatch.monitor.group import worker_dirs

            self.tensorboard = tensorboard_export.TensorBoardExport(
                self.ns.tensorboard, run_dir.name, per_worker=worker_dirs(run_dir) is not None)
            say(f"TensorBoard scalars into {self.tensorboard.folder}")
            outlets.append(self.tensorboard)
        if self.metrics is not None:
            say(f"Prometheus metrics on {self.metrics.url}")
            outlets.append(self.metrics.metrics)
        if outlets:
            self.relay = Relay(relay_source(run_dir), is_alive, outlets).start()

    def _report(self, line: str) -> None:
        if self._quiet:
            self._held.append(line)
        else:
            say(line)

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            if self.relay.error is not None:
                self._held.append(f"--notify/--metrics/--tensorboard stopped early: {self.relay.error!r}")
            self._held.extend(self.relay.errors)
        self._quiet = False
        for line in self._held:
            say(line)
        self._held.clear()
        if self.alerts is not None:
            say(self.alerts.summary())
        if self.metrics is not None:
            self.metrics.close()
