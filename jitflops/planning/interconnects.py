"""Interconnects as a plan sees them: the bandwidth of each tier a collective can cross, per GPU and
direction, and a fixed cost per step of a ring.

A node's GPUs talk over NVLink (through NVSwitch), AMD's Infinity Fabric or PCIe; nodes over
InfiniBand or RoCE, one NIC per GPU in the reference systems. Figures are the datasheets'
(:data:`INTERCONNECTS`, each with its source). What a datasheet leaves out, the efficiency puts in:
the share of the link a collective's bus bandwidth reaches (nccl-tests' definition), a typical
figure, not a measurement of this package (all-reduce bus bandwidth in a DGX H100 reaches about 80%
of NVLink's 450 GB/s each way; over InfiniBand NDR about 90% of its 50 GB/s).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from typing import Mapping
from pathlib import Path

from ..estimates.devices import device_spec, is_device_name

GB = 1e9


class InterconnectError(ValueError):
    """An interconnect name that names none of the table's: the message lists them."""


@dataclass(frozen=True)
class Interconnect:
    """The tiers a collective crosses: inside a node of ``gpus_per_node`` GPUs, and between nodes."""

    name: str
    gpus_per_node: int
    intra_node_bandwidth: float
    """Bytes per second each way per GPU inside a node (NVLink, Infinity Fabric, PCIe)."""
    inter_node_bandwidth: float
    """Bytes per second each way per GPU between nodes (its NIC)."""
    intra_node_latency_s: float = 3e-6
    inter_node_latency_s: float = 10e-6
    """A ring step's fixed cost on each tier."""
    efficiency: float = 0.8
    """The share of a link's bandwidth a collective's bus bandwidth reaches (typical, not measured)."""
    inter_node_efficiency: float = 0.9
    measured_collectives: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    """Each collective's ``latency_s`` per ring step and ``bus_bandwidth`` as measured on one node
    (``jitflops calibrate --collectives``): a backend runs each by an algorithm of its own. A
    collective not in it takes the tiers' figures."""
    blocked_wait_s: float = 0.0
    """What each collective costs beyond its time back to back where it is called right after
    compute and blocks (measured by ``jitflops calibrate --collectives`` on a CPU's gloo ranks; 0
    on a datasheet's fabric)."""
    source: str = ""

    def latency(self, crosses_nodes: bool) -> float:
        return self.inter_node_latency_s if crosses_nodes else self.intra_node_latency_s


INTERCONNECTS: dict[str, Interconnect] = {link.name: link for link in (
    Interconnect("dgx-h100", 8, 450 * GB, 50 * GB, source="NVIDIA DGX H100 datasheet: 18 NVLink 4 links, 900 GB/s per GPU both ways, through 4 NVSwitches; "
                                                      "8 ConnectX-7 400 Gb/s InfiniBand NDR ports, one per GPU"),
    Interconnect("hgx-h200", 8, 450 * GB, 50 * GB, source="NVIDIA HGX H200 datasheet: NVLink 4, 900 GB/s per GPU both ways; one 400 Gb/s NIC per GPU "
                                                      "(the reference design's ConnectX-7)"),
    Interconnect("dgx-b200", 8, 900 * GB, 50 * GB, source="NVIDIA DGX B200 datasheet: NVLink 5, 1.8 TB/s per GPU both ways; 8 ConnectX-7 400 Gb/s ports"),
    Interconnect("dgx-a100", 8, 300 * GB, 25 * GB, source="NVIDIA DGX A100 datasheet: NVLink 3, 600 GB/s per GPU both ways, through NVSwitch; "
                                                      "8 ConnectX-6 200 Gb/s HDR InfiniBand ports (the 40 GB and 80 GB systems alike)"),
    Interconnect("mi300x-platform", 8, 448 * GB, 50 * GB, source="AMD Instinct MI300X platform: 7 Infinity Fabric links of 128 GB/s per GPU both ways "
                                                             "(896 GB/s), fully connected; one 400 Gb/s NIC per GPU in the reference design"),
    Interconnect("pcie-gen5", 8, 64 * GB, 50 * GB, intra_node_latency_s=5e-6, efficiency=0.7,
                 source="PCIe 5.0 x16: 64 GB/s each way per GPU, no NVLink; one 400 Gb/s NIC per GPU"),
    Interconnect("pcie-gen4", 8, 32 * GB, 12.5 * GB, intra_node_latency_s=5e-6, efficiency=0.7,
                 source="PCIe 4.0 x16: 32 GB/s each way per GPU, no NVLink; one 100 Gb/s NIC per GPU"),
)}
"""Reference systems by name; :func:`interconnect` also takes each device's usual one (``h100``: ``dgx-h100``)."""

FOR_DEVICE = {"h100-sxm": "dgx-h100", "h200": "hgx-h200", "gh200": "hgx-h200", "b200": "dgx-b200", "a100-80gb": "dgx-a100", "a100-40gb": "dgx-a100",
              "mi300x": "mi300x-platform", "mi325x": "mi300x-platform", "h100-pcie": "pcie-gen5", "l40s": "pcie-gen4", "l4": "pcie-gen4",
              "a10": "pcie-gen4", "a10g": "pcie-gen4", "a6000": "pcie-gen4", "rtx-6000-ada": "pcie-gen4"}
"""The interconnect a device usually comes with (its reference system), by the device table's name."""


def interconnect(name: str) -> Interconnect:
    """The table's interconnect called ``name`` (or the reference system of a device of the device
    table), or the one a JSON file describes (``jitflops calibrate --collectives N --output FILE``)."""
    if name.endswith(".json") or Path(name).is_file():
        return _from_file(name)
    key = name.strip().lower()
    if key not in INTERCONNECTS and is_device_name(key):
        key = device_spec(key).name  # the table's own name of an alias: h100 is h100-sxm
    key = FOR_DEVICE.get(key, key)
    if key in INTERCONNECTS:
        return INTERCONNECTS[key]
    close = difflib.get_close_matches(key, [*INTERCONNECTS, *FOR_DEVICE], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise InterconnectError(f"unknown interconnect {name!r}{hint} (known: {', '.join(sorted(INTERCONNECTS))})")


def _from_file(path: str) -> Interconnect:
    """The interconnect of a calibration's file (its ``interconnect`` entry) or of a file of its fields."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise InterconnectError(f"cannot read the interconnect {path!r}: {error}") from None
    fields = document.get("interconnect", document) if isinstance(document, dict) else None
    known = {field.name for field in dataclasses.fields(Interconnect)}
    if not isinstance(fields, dict) or not {"name", "gpus_per_node", "intra_node_bandwidth", "inter_node_bandwidth"} <= fields.keys() or fields.keys() - known:
        raise InterconnectError(f"the interconnect {path!r} is not one: it needs name, gpus_per_node, intra_node_bandwidth and inter_node_bandwidth "
                                f"(and takes {', '.join(sorted(known))})")
    return Interconnect(**fields)
