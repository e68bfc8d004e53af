"""Run plans on several machines from one head node: a node agent per host, torchrun on each for every run.

::

    with MultiNode(Hosts(hosts=("node1", "node2"), launcher=LAUNCHERS["ssh"], master_addr="node1", master_port=29500),
                   devices_per_node=4) as nodes:
        result = nodes.launch(cfg)          # as runtime/launch.py's launch, on the hosts' devices

[Note: one head, many runs] A profiling campaign makes dozens of runs, each deciding the next (a span
that ran out of memory is re-packed), and writes each to one SQLite file. So one process, on the head
node, runs the campaign and owns the database, as for local runs; it starts one node agent per host
through the launcher (``ssh {host}``, ``srun``: runtime/hosts.py) once, and for each run asks the first
``ceil(devices / K)`` agents to start torchrun with ``--nnodes n --node-rank r`` and a static rendezvous
at ``--master-addr:--master-port`` (node 0 hosts it; runs follow one another, so each run's rendezvous
is the port freed by the last). Every rank writes its report on its own node; the agents send them back,
and the head makes the run's result exactly as the local launcher does (runtime/result.py ``aggregate``,
``root_cause``): same measurements, same failure reasons, so the campaign records and resumes
multi-node runs as local ones. torchrun on every node was the alternative where the user starts the
same command on each node; it would need every node to replay the campaign's decisions.

No process outlives the head: each agent ends torchrun and itself when its stdin ends
(runtime/node.py), which happens whenever the head exits, whatever killed it; :meth:`MultiNode.close`
closes them and waits. Start-up problems (a host that cannot be reached, a taken port) are found when
the agents start, in a second or two, before any run.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any

from hybridplan.errors import LaunchError
from hybridplan.runtime.config import RunConfig, config_to_json, validate_config
from hybridplan.runtime.hosts import Hosts, launcher_argv
from hybridplan.runtime.node import PREFIX
from hybridplan.runtime.result import RankFailure, RankReport, RunResult, aggregate, failed_result, report_from_dict, root_cause

__all__ = ["MultiNode"]

_START_S = 120.0
"""Seconds each agent has to say hello: an ssh connection or a SLURM job step takes seconds, not minutes."""
_ANSWER_MARGIN_S = 60.0
"""Seconds past a run's timeout to wait for an agent's answer: the agent ends a run at its timeout itself."""
_GRACE_S = 10.0
"""Seconds an agent has to end its torchrun and exit once its stdin is closed (its own grace is 5 s)."""


class MultiNode:
    """The node agents of :class:`Hosts`, started on entering the context and ended on leaving it.

    Args:
        hosts: the machines.
        devices_per_node: ranks each node runs at most (K of an NxK cluster).
        on_event: called with short progress messages.
    """

    def __init__(self, hosts: Hosts, *, devices_per_node: int, on_event: Callable[[str], None] | None = None) -> None:
        self.hosts = hosts
        self.devices_per_node = devices_per_node
        self.say = on_event or (lambda _msg: None)
        self._agents: list[subprocess.Popen[str]] = []
        self._answers: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self._runs = 0

    def __enter__(self) -> MultiNode:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ agents
    def _start(self) -> None:
        """Start one agent per host and wait for each hello.

        Raises:
            LaunchError: if a host's agent ends or says nothing within :data:`_START_S`, or node 0's port is taken.
        """
        for node, host in enumerate(self.hosts.hosts):
            check = f" --check-port {self.hosts.master_port} --check-addr {shlex.quote(self.hosts.master_addr)}" if node == 0 else ""
            argv = launcher_argv(self.hosts.launcher, host, _agent_command() + check)
            try:
                agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            except OSError as e:
                raise LaunchError(f"cannot start the launcher for host {host!r} ({shlex.join(argv[:3])} ...): {e}",
                                  fix="check --launcher") from None
            self._agents.append(agent)
            if agent.stdout is None:  # stdout=PIPE gives one
                raise LaunchError(f"the launcher for host {host!r} has no output pipe", fix="report this as a bug")
            threading.Thread(target=self._listen, args=(node, agent.stdout), daemon=True).start()
        deadline = time.monotonic() + _START_S
        for node, hello in self._collect(range(len(self.hosts.hosts)), deadline).items():
            host = self.hosts.hosts[node]
            if hello is None:
                # Its output ended (or the deadline passed): an agent whose output ended is exiting, but the pipe
                # closes just before the process is reaped, so give it a moment to report its exit code.
                try:
                    code: int | None = self._agents[node].wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    code = None
                how = "did not answer" if code is None else f"ended with code {code} before answering"
                raise LaunchError(f"the agent on host {host!r} {how} (launcher: {self.hosts.launcher!r})",
                                  fix="check that the host is reachable by the launcher and runs this Python"
                                  f" ({sys.executable}) with hybridplan installed; its error is printed above")
            if hello.get("error"):
                raise LaunchError(f"host {host!r}: {hello['error']}",
                                  fix="give --master-addr an address of the first host and a free --master-port")
        self.say(f"node agents ready on {len(self._agents)} hosts: {', '.join(self.hosts.hosts)}")

    def _listen(self, node: int, stream: IO[str]) -> None:
        """Pass agent ``node``'s answers on; None once its output ends."""
        for line in stream:
            if line.startswith(PREFIX):
                self._answers.put((node, json.loads(line[len(PREFIX):])))
        self._answers.put((node, None))

    def _collect(self, nodes: range, deadline: float) -> dict[int, dict[str, Any] | None]:
        """One answer from each of ``nodes`` (None for an agent that ended or passed ``deadline``)."""
        got: dict[int, dict[str, Any] | None] = {}
        while len(got) < len(nodes):
            try:
                node, answer = self._answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return {n: got.get(n) for n in nodes}
            if node in nodes and node not in got:
                got[node] = answer
        return got

    def close(self) -> None:
        """Close every agent's stdin (it ends its torchrun and exits), wait, kill what is left."""
        for agent in self._agents:
            try:
                if agent.stdin is not None:
                    agent.stdin.close()
            except OSError:  # the agent is gone already
                pass
        deadline = time.monotonic() + _GRACE_S
        for agent in self._agents:
            try:
                agent.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        self._agents = []

    # ------------------------------------------------------------------ runs
    def launch(self, cfg: RunConfig) -> RunResult:
        """Train ``cfg.plan`` on the hosts' devices (device d on node d // K, local rank d % K).

        Returns:
            The result, as runtime/launch.py's ``launch`` returns it (never raises for a failed run).

        Raises:
            HybridPlanError: if the configuration is invalid, or needs more devices than the hosts have.
            LaunchError: if an agent ends or stops answering (the connection to its host is lost).
        """
        validate_config(cfg)
        world, k = cfg.plan.num_devices, self.devices_per_node
        nnodes = math.ceil(world / k)
        if cfg.backend != "real" or nnodes > len(self._agents):
            raise LaunchError(f"a {cfg.backend} run of {world} devices cannot run on {len(self._agents)} hosts of {k} devices",
                              fix="give as many --hosts as the cluster has nodes; simulated runs need no hosts")
        self._runs += 1
        common = {"run": self._runs, "config": config_to_json(cfg), "nnodes": nnodes, "master_addr": self.hosts.master_addr,
                  "master_port": self.hosts.master_port, "timeout_s": cfg.timeout_s}
        started = time.perf_counter()
        for node in range(nnodes):
            self._send(node, {**common, "node_rank": node, "nproc": min(k, world - node * k)})
        self.say(f"started {world} processes on {nnodes} hosts")
        answers = self._collect(range(nnodes), time.monotonic() + cfg.timeout_s + _ANSWER_MARGIN_S)
        wall = time.perf_counter() - started
        lost = [self.hosts.hosts[n] for n, a in answers.items() if a is None or a.get("run") != self._runs]
        if lost:
            raise LaunchError(f"lost the agent on host(s) {lost} during a run", fix="check the hosts; run the command again to resume")
        got = {n: a for n, a in answers.items() if a is not None}
        if not any(a["reports"] or a["timed_out"] for a in got.values()):
            # No rank reached its training code on any node: the rendezvous failed (a firewall, an address
            # other nodes cannot reach), not the plan. Recording it would fail every run of the campaign.
            said = "; ".join(f"{self.hosts.hosts[n]}: {_last_line(a['log_tail'])}" for n, a in sorted(got.items()))
            raise LaunchError(f"no rank of the run started (torchrun: {said})",
                              fix="check that every host reaches --master-addr:--master-port; run the command again to resume")
        return self._result(cfg, got, wall)

    def _send(self, node: int, message: dict[str, Any]) -> None:
        agent = self._agents[node]
        try:
            if agent.stdin is None:  # stdin=PIPE gives one
                raise LaunchError(f"the launcher of node {node} has no input pipe", fix="report this as a bug")
            agent.stdin.write(json.dumps(message) + "\n")
            agent.stdin.flush()
        except OSError:
            raise LaunchError(f"lost the agent on host {self.hosts.hosts[node]!r}",
                              fix="check the host; run the command again to resume") from None

    def _result(self, cfg: RunConfig, answers: dict[int, dict[str, Any]], wall: float) -> RunResult:
        """The run's result from every node's answer, as runtime/processes.py makes it from local ranks."""
        world, k = cfg.plan.num_devices, self.devices_per_node
        reports: list[RankReport | RankFailure | None] = [None] * world
        for answer in answers.values():
            for data in answer["reports"]:
                report = report_from_dict(data)
                reports[report.rank] = report
        if any(a["timed_out"] for a in answers.values()):
            running = [r for r, rep in enumerate(reports) if rep is None]
            return failed_result(cfg, "failed", f"timed out after {cfg.timeout_s:.0f} s (ranks still running: {running})", wall)
        failed = [r for r, rep in enumerate(reports) if not isinstance(rep, RankReport)]
        if not failed:
            return aggregate(cfg, [rep for rep in reports if isinstance(rep, RankReport)], wall_seconds=wall)

        def crashed(rank: int) -> tuple[str, int | None]:
            node = rank // k
            answer = answers[node]
            return (f"ended on host {self.hosts.hosts[node]!r} (torchrun exited with code {answer['exit_code']}:"
                    f" {_last_line(answer['log_tail'])})"), None

        return root_cause(cfg, reports, wall, failed=failed, crashed=crashed)


def _agent_command() -> str:
    """The shell command line that starts a node agent: this Python, in this folder, with this PYTHONPATH
    (a cluster's nodes share the file system that holds them, as SLURM and torchrun users expect)."""
    parts = ["cd", shlex.quote(os.getcwd()), "&&", "exec"]
    if os.environ.get("PYTHONPATH"):
        parts += ["env", shlex.quote(f"PYTHONPATH={os.environ['PYTHONPATH']}")]
    return " ".join([*parts, shlex.quote(sys.executable), "-m", "hybridplan.runtime.node"])


def _last_line(log: str) -> str:
    """The last non-empty line of torchrun's output, shortened: usually the error."""
    return next((line.strip()[:300] for line in reversed(log.splitlines()) if line.strip()), "(no output)")
