"""Which machines a multi-node run uses and how a command is started on each: host lists, SLURM's
compressed node lists, launcher templates.

Torch-free and quick, so that the CLI checks all of it before any long work (runtime/multinode.py uses
it to start one node agent per host).

A host list is comma-separated; each item may be a SLURM node-list expression, ``gpu[01-03,07]``
standing for ``gpu01,gpu02,gpu03,gpu07`` (ranges keep their zero padding; several bracket groups in
one name multiply: ``r[1-2]n[1-2]`` is ``r1n1,r1n2,r2n1,r2n2``, as ``scontrol show hostnames`` lists
them). ``slurm`` reads the allocation the command runs in (``SLURM_JOB_NODELIST``, checked against
``SLURM_JOB_NUM_NODES``).

A launcher template is the command that runs a shell command line on a host: ``{host}`` is replaced by
the host's name and ``{command}`` (one argument) by the command line, appended when the template does
not place it. The presets are ``ssh`` (the head node reaches every host by key, without a password),
``srun`` (inside a SLURM allocation: one job step of one task per node) and ``local`` (every "host" is
this machine: for trying a multi-node set-up, and for the tests).

[Note: nothing from a host list is an option] A launcher reads a word that starts with ``-`` as an option
of its own (``ssh -oProxyCommand=...`` runs a command on this machine), so no host name, and no
``--master-addr``, may start with ``-``: refused when the list is read, before anything starts. The ssh
preset also puts ``--`` before the host, so that ssh stops reading options there whatever the name.
``{host}`` may stand inside a word (``--nodelist={host}``): a host name holds only letters, digits and
``._:-``, nothing a shell or a launcher would read otherwise. ``{command}`` is one whole word, at most
once: inside a word (``sh -c 'cd /x && {command}'``) it would need quoting rules of the launcher's own,
so such a template is refused when checked, as is any other ``{...}`` and an empty template.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from hybridplan.errors import UsageError
from hybridplan.plan.cluster import MAX_DEVICES

__all__ = ["Hosts", "LAUNCHERS", "expand_nodelist", "parse_hosts", "slurm_hosts", "launcher_argv", "check_launcher",
           "check_address", "MAX_HOSTS"]

LAUNCHERS = {
    "ssh": "ssh -o BatchMode=yes -- {host} {command}",
    "srun": "srun --nodes=1 --ntasks=1 --nodelist={host} --kill-on-bad-exit=1 sh -c {command}",
    "local": "sh -c {command}",
}
"""The launcher presets by name. ssh's BatchMode makes a host that would ask for a password fail at once
instead of waiting for an answer nobody gives; its ``--`` ends ssh's options before the host name."""

_NAME = re.compile(r"^[A-Za-z0-9._:-]+$")
"""A host name or address: letters, digits, dots, dashes, underscores, colons (IPv6)."""
_RANGE = re.compile(r"^(\d{1,18})(?:-(\d{1,18}))?$")
"""A number or a range of a node list; 18 digits at most (a longer number names no host, and Python refuses to read
one of more than 4,300)."""
MAX_HOSTS = MAX_DEVICES
"""The most hosts a list may name: as many as a cluster's devices may be (plan/cluster.py), a node having at
least one. A range such as ``gpu[1-99999999999]`` is refused before its names are made."""
_PLACEHOLDER = re.compile(r"\{[^{}\s]*\}")
"""A ``{...}`` in a launcher template."""
_NAME_FIX = "host names are letters, digits, '.', '-', '_' and ranges in brackets, e.g. gpu[01-03,07]"


@dataclass(frozen=True, kw_only=True)
class Hosts:
    """The machines of a multi-node run and how to reach them."""

    hosts: tuple[str, ...]
    """One per node, node 0 first (it hosts the rendezvous)."""
    launcher: str
    """A launcher template (runtime/hosts.py ``check_launcher``)."""
    master_addr: str
    """The address of node 0 that every node can reach."""
    master_port: int
    """The rendezvous port on node 0."""


def expand_nodelist(text: str) -> list[str]:
    """The host names of a SLURM node-list expression, in order (``gpu[01-03,07],cpu1``).

    Raises:
        UsageError: for an empty list, an empty item, unbalanced brackets, a range that is not
            ``a-b`` of digits with a <= b, a character no host name has, a host that starts with ``-``
            ([Note: nothing from a host list is an option]), or more than :data:`MAX_HOSTS` hosts.
    """
    items = _split_top(text)
    if not text.strip() or any(not item.strip() for item in items):
        raise UsageError(f"host list {text!r} has an empty item",
                         fix="give comma-separated host names, e.g. node1,node2 or gpu[01-04]")
    for item in items:  # a host starts as its item does (a bracket starts with a digit)
        _no_option(item.strip(), f"host list {text!r}: host {item.strip()!r}")
    return [host for item in items for host in _expand(item.strip(), text)]


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _expand(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        if "]" in item or not _NAME.match(item):
            raise UsageError(f"host list {whole!r}: {item!r} is not a host name", fix=_NAME_FIX)
        return [item]
    close_at = item.find("]", open_at)
    if close_at < 0 or "[" in item[open_at + 1 : close_at]:
        raise UsageError(f"host list {whole!r}: unbalanced brackets in {item!r}", fix="write ranges as name[01-03,07]")
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None or (match.group(2) is not None and int(match.group(2)) < int(match.group(1))):
            raise UsageError(f"host list {whole!r}: {part!r} in [{body}] is not a number or a rising range a-b",
                             fix="write ranges as name[01-03,07]")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        _check_count(len(numbers) + int(hi) - int(lo) + 1, whole)
        numbers += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    tails = _expand(rest, whole) if rest else [""]
    _check_count(len(numbers) * len(tails), whole)
    return [h for n in numbers for h in _expand_name(prefix + n, whole, tails)]


def _expand_name(head: str, whole: str, tails: list[str]) -> list[str]:
    if head and not _NAME.match(head):
        raise UsageError(f"host list {whole!r}: {head!r} is not a host name", fix=_NAME_FIX)
    return [head + tail for tail in tails]


def _check_count(count: int, whole: str) -> None:
    """Refuse a list of more hosts than :data:`MAX_HOSTS` before it is built."""
    if count > MAX_HOSTS:
        raise UsageError(f"host list {whole!r} names more than {MAX_HOSTS:,} hosts",
                         fix="give one host per node of --cluster")


def _no_option(name: str, what: str) -> None:
    """Refuse a name a launcher would read as an option ([Note: nothing from a host list is an option])."""
    if name.startswith("-"):
        raise UsageError(f"{what} starts with '-', which the launcher would read as an option",
                         fix="give host names and addresses that start with a letter or a digit")


def check_address(address: str) -> str:
    """``--master-addr``: a host name or address, as a host list's items (no brackets), not starting with ``-``.

    Raises:
        UsageError: naming the address.
    """
    if not _NAME.match(address):
        raise UsageError(f"--master-addr {address!r} is not a host name or address", 
                         fix="give an address of the first host: letters, digits, '.', '-', '_', ':'")
    _no_option(address, f"--master-addr {address!r}")
    return address


def slurm_hosts(environ: Mapping[str, str]) -> list[str]:
    """The hosts of the SLURM allocation described by ``environ`` (the command's environment).

    Raises:
        UsageError: outside an allocation, or if the node list and node count disagree.
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise UsageError("--hosts slurm: SLURM_JOB_NODELIST is not set (not inside a SLURM allocation)",
                         fix="run inside salloc/sbatch, or list the hosts: --hosts node1,node2")
    hosts = expand_nodelist(nodelist)
    count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
    if count is not None and count.strip() != str(len(hosts)):
        raise UsageError(f"SLURM_JOB_NODELIST {nodelist!r} names {len(hosts)} node(s) but SLURM_JOB_NUM_NODES is {count!r}",
                         fix="list the hosts yourself with --hosts")
    return hosts


def parse_hosts(text: str, environ: Mapping[str, str]) -> list[str]:
    """``--hosts``: ``slurm``, or a host list (module docstring)."""
    return slurm_hosts(environ) if text.strip() == "slurm" else expand_nodelist(text)


def check_launcher(template: str) -> str:
    """The template of ``--launcher`` (a preset's name or a template), checked.

    Raises:
        UsageError: if it is empty or does not split into words, if a template other than ``local``'s has no
            ``{host}``, or if ``{command}`` is not one whole word at most once, or it has any other ``{...}``
            ([Note: nothing from a host list is an option]).
    """
    resolved = LAUNCHERS.get(template, template)
    try:
        words = shlex.split(resolved)
    except ValueError as e:
        raise UsageError(f"--launcher {template!r} does not split into words: {e}") from None
    if not words:
        raise UsageError(f"--launcher {template!r} is empty",
                         fix=f"name a preset ({', '.join(LAUNCHERS)}) or give a template with {{host}}")
    unknown = sorted({p for w in words for p in _PLACEHOLDER.findall(w)} - {"{host}", "{command}"})
    if unknown:
        raise UsageError(f"--launcher {template!r} has {', '.join(unknown)}, which is not a placeholder",
                         fix="use {host} (the host's name) and {command} (the command line, one whole word)")
    inside = [w for w in words if "{command}" in w and w != "{command}"]
    if inside or words.count("{command}") > 1:
        what = f"{{command}} inside the word {inside[0]!r}" if inside else "{command} more than once"
        raise UsageError(f"--launcher {template!r} has {what}: the command line is substituted as one whole word, once",
                         fix="make {command} a word of its own (e.g. 'ssh {host} {command}'), or leave it out: it is"
                         " appended")
    if template != "local" and not any("{host}" in w for w in words):
        raise UsageError(f"--launcher {template!r} has no {{host}}: every host's agent would start on the same machine",
                         fix=f"put {{host}} where the host goes, e.g. 'ssh {{host}}', or use --launcher local on purpose")
    return resolved


def launcher_argv(template: str, host: str, command: str) -> list[str]:
    """The command that runs shell command line ``command`` on ``host`` by ``template`` (checked by
    :func:`check_launcher`)."""
    argv = [command if w == "{command}" else w.replace("{host}", host) for w in shlex.split(template)]
    return argv if "{command}" in shlex.split(template) else [*argv, command]
