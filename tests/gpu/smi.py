"""What the GPU tests read from outside the process under test: ``nvidia-smi`` (the GPUs, which
processes hold a context on them) and ``/proc`` (a process's descendants, whether one lives).

The pytest process itself never initialises CUDA: its own context would show up in
``nvidia-smi`` and take memory the measuring children need.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi lists it (index: nvidia-smi's, i.e. PCI bus order)."""

    index: str
    uuid: str
    name: str
    memory_mib: int
    compute_cap: str
    driver: str


def query(fields: str, what: str = "--query-gpu") -> list[list[str]]:
    """Rows of ``nvidia-smi {what}={fields} --format=csv,noheader,nounits``."""
    out = subprocess.run(["nvidia-smi", f"{what}={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines()
            if line.strip() and "No running" not in line]


def all_gpus() -> list[Gpu]:
    rows = query("index,uuid,name,memory.total,compute_cap,driver_version")
    return [Gpu(r[0], r[1], r[2], int(float(r[3])), r[4], r[5]) for r in rows]


def visible_gpus(value: str | None = None) -> list[Gpu]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` (default: this process's) makes visible, in its order:
    indices (nvidia-smi's order), ``GPU-`` UUIDs or their prefixes; up to the first entry that
    names none (CUDA stops reading there). All of them when it is unset."""
    gpus = all_gpus()
    value = os.environ.get("CUDA_VISIBLE_DEVICES") if value is None else value
    if value is None:
        return gpus
    out = []
    for entry in (e.strip() for e in value.split(",")):
        match = [g for g in gpus if (entry.isdigit() and g.index == entry)
                 or (entry.startswith("GPU-") and g.uuid.startswith(entry))]
        if not entry or not match:
            break
        out.append(match[0])
    return out


def compute_pids() -> set[int]:
    """Processes holding a CUDA context on any GPU."""
    return {int(row[0]) for row in query("pid", "--query-compute-apps") if row[0].isdigit()}


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc: children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = text[text.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie holds no GPU memory)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] != "Z"


def state_line() -> str:
    """Clocks, power and temperature of every GPU, for a failure message."""
    rows = query("index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu")
    return "; ".join(f"GPU {r[0]}: SM {r[1]} MHz, mem {r[2]} MHz, {r[3]} W, {r[4]} C, {r[5]}%"
                     for r in rows)
