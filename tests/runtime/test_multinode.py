"""Runs on several machines from one head (runtime/multinode.py and its node agent, runtime/node.py), with
two "nodes" on this machine (``--launcher local``, rendezvous on 127.0.0.1): a failed run is reported as the
local launcher reports it (out of memory, timed out); hosts that cannot serve are refused before any run. A whole campaign on two
nodes, equal to a local one and resumed after a kill: tests/cli/test_profile.py."""

from __future__ import annotations

import socket
import sys

import pytest

from hybridplan.errors import LaunchError
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.hosts import LAUNCHERS, Hosts
from hybridplan.runtime.launch import launch
from hybridplan.runtime.multinode import MultiNode
from tests.runtime.util import free_port, make_plan

MLP = "tests.cli.user_models:mlp"
PLAN = make_plan("1f1b", 8, 2, [(0, 2, "none", [0]), (2, 5, "none", [1])])


def two_nodes(port: int, launcher: str = LAUNCHERS["local"]) -> MultiNode:
    return MultiNode(Hosts(hosts=("127.0.0.1", "127.0.0.1"), launcher=launcher, master_addr="127.0.0.1", master_port=port),
                     devices_per_node=1)


@pytest.mark.distributed
def test_a_run_that_runs_out_of_memory_on_the_second_node_is_reported_as_locally():
    """Stage 1 (on node 1) needs more than 20 KiB: the same status and reason as the local launcher's, which
    name the device, its stage and the bytes; a run is a run of the campaign, so it is then recorded as a
    local failure is (profiling/campaign.py)."""
    cfg = RunConfig(model=MLP, plan=PLAN, cluster=Cluster.parse("1x2", device_memory="20KiB"), iterations=2)
    local = launch(cfg)
    assert local.status == "oom" and local.reason is not None and local.reason.startswith("device 1 (stage 1)")
    with two_nodes(free_port()) as nodes:
        result = nodes.launch(cfg)
    assert (result.status, result.reason) == (local.status, local.reason)
    assert result.devices == []


def test_a_taken_rendezvous_port_is_refused_before_any_run():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} on .* is not free"):
            with two_nodes(port):
                pytest.fail("started with the port taken")


def test_a_host_the_launcher_cannot_reach_is_refused_before_any_run():
    """A launcher that fails as ssh fails for an unknown host (exit code 255)."""
    with pytest.raises(LaunchError, match="the agent on host '127.0.0.1' ended with code 255 before answering"):
        with two_nodes(free_port(), launcher="sh -c 'exit 255' {host}"):
            pytest.fail("started without agents")


@pytest.mark.distributed
def test_a_run_past_its_timeout_is_ended_on_every_node_and_reported_as_locally():
    """Layer 5, the first of stage 1 (node 1), hangs; each agent ends its torchrun at the timeout, and the result says
    what the local launcher says of a run that timed out: which ranks had not finished (all)."""
    plan = make_plan("1f1b", 8, 2, [(0, 5, "none", [0]), (5, 10, "none", [1])])
    cfg = RunConfig(model="tests.runtime.faulty_models:hanging_gpt", plan=plan, cluster=Cluster.parse("1x2"), iterations=2, timeout_s=10)
    with two_nodes(free_port()) as nodes:
        result = nodes.launch(cfg)
    assert (result.status, result.reason) == ("failed", "timed out after 10 s (ranks still running: [0, 1])")
    assert result.wall_seconds is not None and 10 <= result.wall_seconds < 10 + 30


_FAKE_AGENT = '''
import json, sys
node0 = "--check-port" in sys.argv[-1]  # the head asks node 0 alone to check the port
say = lambda m: print("hybridplan-node: " + json.dumps(m), flush=True)
say(dict(hello="fake", pid=0, error=None))
for line in sys.stdin:
    run = json.loads(line)["run"]
    if sys.argv[1] == "rendezvous":  # torchrun fails before any rank runs
        say(dict(run=run, exit_code=1, timed_out=False, reports=[], log_tail="DistNetworkError: connect timed out\\n"))
    elif node0:  # rank 0 loses its peer, whose process was killed before it wrote its report
        lost = dict(status="failed", rank=0, reason="device 0: RuntimeError: Connection closed by peer", time=1.0, traceback="")
        say(dict(run=run, exit_code=1, timed_out=False, reports=[lost], log_tail="ChildFailedError\\n"))
    else:
        say(dict(run=run, exit_code=1, timed_out=False, reports=[], log_tail="Signal 9 (SIGKILL) received by PID 7\\n"))
'''


@pytest.mark.parametrize("case", ["rendezvous", "killed"])
def test_what_the_agents_report_becomes_the_runs_result_or_stops_the_campaign(tmp_path, case):
    """Node agents stood in for by a script answering as agents do (runtime/node.py) without torch: a rank
    that died without a report on node 1 is the root cause, named with its host and torchrun's last line;
    a run no rank of which started (the rendezvous failed) is no failure of the plan but stops the command,
    so that a campaign does not record every run as failed."""
    fake = tmp_path / "agent.py"
    fake.write_text(_FAKE_AGENT)
    cfg = RunConfig(model=MLP, plan=PLAN, cluster=Cluster.parse("1x2"), iterations=2)
    with two_nodes(free_port(), launcher=f"{sys.executable} {fake} {case} {{host}}") as nodes:
        if case == "rendezvous":
            with pytest.raises(LaunchError, match="no rank of the run started \\(torchrun: 127.0.0.1: DistNetworkError"):
                nodes.launch(cfg)
            return
        result = nodes.launch(cfg)
    assert (result.status, result.reason) == (
        "failed", "device 1 (stage 1) ended on host '127.0.0.1' (torchrun exited with code 1: Signal 9 (SIGKILL)"
        " received by PID 7) without a report")
