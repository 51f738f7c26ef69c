"""A cluster from what a user types: a file, a machine shorthand, or figures in human units.

* :func:`cluster_from_spec` — ``--cluster`` of every command: a ``gpp-cluster/1`` file, or a
  machine shorthand ``NAME:N`` / ``NAME:NODESxPER_NODE`` (:mod:`gpp_solver.formats.machines`);
  a file of another kind (a PipeDream profile, a plan) is named with what to run instead.
* :func:`cluster_from_figures` — ``gpp cluster``: a machine to start from and/or figures such as
  ``80GiB``, ``450GB/s``, ``200Gb/s``, ``10us`` (:mod:`gpp_solver.formats.units`), checked as a
  ``gpp-cluster/1`` document (its fields and units: ``docs/formats.md``).
"""

from __future__ import annotations

from pathlib import Path

from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.cluster import cluster_from_dict, cluster_to_dict, load_cluster
from gpp_solver.formats.machines import is_machine_spec, parse_machine_spec
from gpp_solver.formats.sniff import load_expecting
from gpp_solver.formats.units import (
    format_bandwidth,
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_bytes,
    parse_seconds,
)
from gpp_solver.types import Cluster


def cluster_from_spec(spec: str) -> Cluster:
    """A cluster file, or a machine shorthand (a file of that name wins)."""
    if not Path(spec).exists() and (is_machine_spec(spec) or _looks_like_shorthand(spec)):
        return parse_machine_spec(spec)  # a malformed shorthand gets the shorthand's message
    return load_expecting(spec, "gpp-cluster/1", load_cluster)


def _looks_like_shorthand(spec: str) -> bool:
    """``h100:3x8x2``, ``v100:`` or ``a100:8``: a ``NAME:...`` with no path separator and no ``.json``."""
    name, colon, _ = spec.partition(":")
    return bool(colon) and bool(name) and "/" not in spec and "\\" not in spec and not spec.endswith(".json")


#: the bandwidth written for a single device, where nothing is transferred between devices (the
#: format requires one; ``gpp_runtime.probe`` writes the same for one rank)
ONE_DEVICE_BANDWIDTH = 1e12


def cluster_from_figures(
    machine: str | None = None,
    *,
    devices: int | None = None,
    devices_per_node: int | None = None,
    memory: str | None = None,
    intra: str | None = None,
    inter: str | None = None,
    latency: str | None = None,
    optimizer_state_factor: float | None = None,
    filled: list[str] | None = None,
) -> Cluster:
    """``machine`` (a shorthand, optional) with the given figures replacing its own.

    Without a machine ``devices`` and ``memory`` are required, and ``inter`` too unless there is
    one device (nothing is transferred: :data:`ONE_DEVICE_BANDWIDTH` is written); ``intra`` needs
    ``devices_per_node`` (without it the network is flat).  Each figure not given that the cluster
    takes from a default or from the machine is appended to ``filled``, as a phrase naming the
    option that sets it.  The names in messages are the options of ``gpp cluster``."""
    if machine is None:
        missing = [f for f, v in (("--devices", devices), ("--memory", memory)) if v is None]
        if missing:
            raise InvalidInputError(f"gpp cluster: without a machine (e.g. h100:2x8) give {', '.join(missing)}")
        if inter is None and devices > 1:
            raise InvalidInputError(
                f"gpp cluster: give --inter (e.g. 1GB/s; gpp_runtime.probe measures it) or a machine: the planner "
                f"prices each transfer between the {devices} devices (activations, gradients, all-reduces) at it, "
                "and picks among plans by their time even when only their memory is asked about"
            )
        if intra is not None and devices_per_node is None:
            raise InvalidInputError(
                "gpp cluster: --intra needs --per-node (without it the network is flat and --inter is used everywhere)"
            )
    d = {} if machine is None else cluster_to_dict(parse_machine_spec(machine))
    d.update(
        {
            k: v
            for k, v in {
                "devices": devices,
                "devices_per_node": devices_per_node,
                "memory_bytes": None if memory is None else parse_bytes(memory, "--memory"),
                "intra_node_bandwidth": None if intra is None else parse_bandwidth(intra, "--intra"),
                "inter_node_bandwidth": None if inter is None else parse_bandwidth(inter, "--inter"),
                "latency": None if latency is None else parse_seconds(latency, "--latency", zero=True),
                "optimizer_state_factor": optimizer_state_factor,
            }.items()
            if v is not None
        }
    )
    if machine is None and inter is None:
        d["inter_node_bandwidth"] = ONE_DEVICE_BANDWIDTH
    c = cluster_from_dict(d)
    if filled is not None:
        filled.extend(_filled(c, machine, devices_per_node, memory, intra, inter, latency, optimizer_state_factor))
    return c


def _filled(c: Cluster, machine, per_node, memory, intra, inter, latency, osf) -> list[str]:
    """What ``c`` holds that was not given: from ``machine``, or the format's defaults."""
    src = f"{machine}'s" if machine else "default"
    out = []
    if machine is not None and memory is None:
        out.append(f"memory {format_bytes(c.memory_bytes)} per device ({src}; --memory)")
    if machine is None and per_node is None and c.devices > 1:
        out.append("a flat network, every pair of devices at --inter's bandwidth (default; --per-node, --intra)")
    if inter is None:
        if machine is None:
            out.append(
                f"bandwidth {format_bandwidth(c.inter_node_bandwidth)}, never used: one device transfers "
                "nothing to another (--inter)"
            )
        elif c.devices_per_node is None or c.devices > c.devices_per_node:
            out.append(f"{format_bandwidth(c.inter_node_bandwidth)} between nodes ({src}; --inter)")
    if intra is None and c.devices_per_node is not None and min(c.devices, c.devices_per_node) > 1:
        how = src if machine else "default: --inter's"
        out.append(
            f"{format_bandwidth(c.intra_node_bandwidth or c.inter_node_bandwidth)} inside a node ({how}; --intra)"
        )
    if latency is None:
        out.append(f"latency {format_seconds(c.latency)} per message ({src}; --latency)")
    if osf is None:
        adam = ", fp32 Adam" if c.optimizer_state_factor == 4 else ""
        out.append(f"optimizer state factor {c.optimizer_state_factor:g} ({src}{adam}; --optimizer-state-factor)")
    return out
