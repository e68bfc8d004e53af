"""Host lists, SLURM node lists and launcher templates (runtime/hosts.py); expected lists written by hand,
as ``scontrol show hostnames`` prints them."""

from __future__ import annotations

import pytest

from hybridplan.errors import UsageError
from hybridplan.runtime.hosts import LAUNCHERS, check_address, check_launcher, expand_nodelist, launcher_argv, parse_hosts, slurm_hosts


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("node1,node2", ["node1", "node2"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("a[1-2],b3,c[5]", ["a1", "a2", "b3", "c5"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
        ("127.0.0.1,127.0.0.1", ["127.0.0.1", "127.0.0.1"]),
    ],
)
def test_node_lists_expand_as_slurm_lists_them(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "has an empty item"),
        ("node1,,node2", "has an empty item"),
        ("node1,", "has an empty item"),
        ("gpu[01-03", "unbalanced brackets"),
        ("gpu01]", "is not a host name"),
        ("gpu[3-1]", "'3-1' in [3-1] is not a number or a rising range"),
        ("gpu[a-b]", "is not a number or a rising range"),
        ("gpu[]", "is not a number or a rising range"),
        ("gpu[[1]]", "unbalanced brackets"),
        ("node 1", "is not a host name"),
        ("-oProxyCommand,localhost", "host '-oProxyCommand' starts with '-'"),
        ("node1,-p", "host '-p' starts with '-'"),
        ("-n[1-2]", "host '-n[1-2]' starts with '-'"),
        ("a, -b", "host '-b' starts with '-'"),
        ("gpu[1-99999999999]", "names more than 1,048,576 hosts"),
        ("r[1-2000]n[1-2000]", "names more than 1,048,576 hosts"),
        ("gpu[1-" + "9" * 5000 + "]", "is not a number or a rising range"),
    ],
)
def test_malformed_node_lists_are_refused_by_name(text, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        expand_nodelist(text)


def test_slurm_allocation_is_read_from_the_environment():
    env = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_NUM_NODES": "2"}
    assert slurm_hosts(env) == ["gpu01", "gpu02"]
    assert parse_hosts("slurm", env) == ["gpu01", "gpu02"]
    assert slurm_hosts({"SLURM_NODELIST": "n[3-4]", "SLURM_NNODES": "2"}) == ["n3", "n4"]  # the older names
    with pytest.raises(UsageError, match="names 2 node\\(s\\) but SLURM_JOB_NUM_NODES is '3'"):
        slurm_hosts({"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_NUM_NODES": "3"})
    with pytest.raises(UsageError, match="not inside a SLURM allocation"):
        parse_hosts("slurm", {})


def test_launcher_templates_place_the_host_and_the_command_line():
    cmd = "cd /w && exec python -m hybridplan.runtime.node"
    assert launcher_argv(check_launcher("ssh"), "gpu01", cmd) == ["ssh", "-o", "BatchMode=yes", "--", "gpu01", cmd]
    assert launcher_argv(check_launcher("srun"), "gpu01", cmd) == [
        "srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu01", "--kill-on-bad-exit=1", "sh", "-c", cmd]
    assert launcher_argv(check_launcher("local"), "127.0.0.1", cmd) == ["sh", "-c", cmd]
    assert launcher_argv(check_launcher("ssh -p 2222 {host}"), "n1", cmd) == ["ssh", "-p", "2222", "n1", cmd]
    assert launcher_argv(check_launcher("pdsh -w {host} {command} --x"), "n1", cmd) == ["pdsh", "-w", "n1", cmd, "--x"]
    assert set(LAUNCHERS) == {"ssh", "srun", "local"}


@pytest.mark.parametrize(
    "template, message",
    [("", "--launcher '' is empty"), ("  ", "is empty"), ("ssh", None), ("ssh node1", "has no {host}"),
     ("ssh '{host}", "does not split into words"),
     ("sh -c 'cd /x && {command}'", "has {command} inside the word 'cd /x && {command}'"),
     ("ssh {host} --cmd={command}", "inside the word '--cmd={command}'"),
     ("ssh {host} {command} {command}", "has {command} more than once"),
     ("ssh {hostname} {command}", "has {hostname}, which is not a placeholder"),
     ("ssh -p {port} {host}", "has {port}, which is not a placeholder")],
)
def test_bad_launchers_are_refused(template, message):
    if message is None:
        check_launcher(template)
        return
    with pytest.raises(UsageError, match=message.replace("{", r"\{").replace("}", r"\}")):
        check_launcher(template)


def test_a_host_inside_a_word_is_substituted():
    assert launcher_argv(check_launcher("mpirun --host={host}:1 {command}"), "n1", "c") == ["mpirun", "--host=n1:1", "c"]


def test_the_master_address_is_a_name_that_is_no_option():
    assert check_address("10.0.0.1") == "10.0.0.1" and check_address("fe80::1") == "fe80::1"
    with pytest.raises(UsageError, match="--master-addr '-oProxyCommand' starts with '-'"):
        check_address("-oProxyCommand")
    with pytest.raises(UsageError, match="is not a host name or address"):
        check_address("node1; rm -rf /")
