"""The GPU's state with every timing (NVML), and the timing protocol that makes timings comparable.

**Why.** On the H200 one 8192x8192x8192 bf16 config ran 1.46 ms in a fresh process after 5 s
idle and 1.68 ms right after 20 s of sustained GEMMs: the SM clock fell from 1980 MHz to
1470 MHz at the 692 W power cap (torch.matmul moved the same way). A timing says as much about
the GPU's clock as about the config, so each timing carries the state it was taken in
(``sample``: SM and memory clock, power, temperature, the throttle reasons bitmask), read through
NVML (``pynvml``, package ``nvidia-ml-py``) on the child's own GPU: the handle is found by the
UUID torch reports (then its PCI bus id), so it is the right GPU under ``CUDA_VISIBLE_DEVICES``.
Without NVML every field is None; the interpreter records no GPU state at all.

**The protocol: settled sustained state** (``TimingOptions.protocol``, env
``TUNER_TIMING_PROTOCOL``; the default). Every full timing (a trial, each round of a
re-timing, the torch baseline, the calibration) is preceded by ``settle_warmup_ms`` (50 ms;
100 ms until the H100's ``bench/results/tuning_time_33i/warmup_floor_h100*.md`` found 50 ms
as close to a 400 ms warm-up as 100 ms) of the timed work itself, unless it follows another
timing back to back (under ``settle_gap_s``: a re-timing's rounds), when the clock is
already at its sustained level. A batch's trials, timed one after the other, keep the short
warm-up back to back only while the power after the previous timing was quiet
(``tuner.backends.child._full_warmup_ms``: right after a lighter config the clock is that
config's, and the winners of a power-capped problem timed 4-14% fast:
``bench/results/batch_bias_probe_h100/``).
Measured on the H200 (``bench/results/warmup_probe_h200.md``, a
compute-bound 8192^3 bf16 config, each timing after 0.3 s idle as in a sweep): with do_bench's
usual 10 ms warm-up a 40 ms timing starts at the ~1965 MHz boost clock the GPU regained while
idle and ends wherever the power limiter has pulled it (1.444 ms, spread 3.8%, and 10-15%
across a real sweep: ``timing_stability_h200_first.md``); after 100 ms or more of the work the
limiter has brought the clock to its sustained level (~1485 MHz at 700 W) and the timing reads
1.634-1.639 ms with a spread of 0.6-0.7%, the same as after 1 s of load. Chosen because:

- it is the state users see: a model runs its kernels back to back, at the sustained clock,
  not at the boost clock of a GPU that just idled;
- it is repeatable (0.6% against 3.8% for boost timings taken after idling), so a stored best
  is replaced only by a real gain;
- it costs 50 ms per full timing, nothing for configs dismissed by their quick timing, and
  needs no knowledge of a particular GPU's clock bands;
- configs, the finalists, the incumbent (the stored best), the torch baseline and the
  calibration's ceilings are all timed in that state, so ratios compare like with like.

Alternatives kept as options and measured worse: ``cool`` (idle until the power reading is
under half the limit before each timing: it rarely waited, NVML's power reading lags the
limiter, and the spread across a sweep was 13.9%) and ``none``. The older long settle (run the
load until the SM clock stops falling, up to ``settle_max_ms``) is off by default: the
per-timing warm-up gives the same number.

The clocks drawn with each measurement (``extra["gpu"]``) show whether a timing was taken
throttled or not; ``settle`` returns what it did (``extra["settle"]`` of the timing after it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only a type here: a model process reading the GPU's state needs no backend
    from tuner.backends.base import TimingOptions

#: the fields of ``extra["gpu"]``
GPU_FIELDS = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle")

#: NVML's clock-event ("throttle") reason bits, for display (nvml.h)
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}

GpuSample = dict[str, float | int | None]


def empty_sample() -> GpuSample:
    """What ``sample`` gives without NVML: every field None."""
    return dict.fromkeys(GPU_FIELDS)


def throttle_reasons(mask: int | None) -> list[str]:
    """The names of the bits set in a throttle-reasons mask ([] for None or 0)."""
    if not mask:
        return []
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return names + ([f"0x{rest:x}"] if rest else [])


class GpuMonitor:
    """Reads one GPU's state through NVML; every field None where NVML (or a reading) is
    missing. ``nvml`` is the pynvml module, ``handle`` the device's NVML handle."""

    def __init__(self, nvml: Any = None, handle: Any = None) -> None:
        self.nvml, self.handle = nvml, handle

    @property
    def available(self) -> bool:
        return self.nvml is not None and self.handle is not None

    def _read(self, fn: Callable[[], Any], scale: float = 1.0) -> float | None:
        try:
            return float(fn()) * scale
        except Exception:  # noqa: BLE001 - a reading this GPU does not support: None
            return None

    def sm_mhz(self) -> float | None:
        if not self.available:
            return None
        return self._read(lambda: self.nvml.nvmlDeviceGetClockInfo(
            self.handle, self.nvml.NVML_CLOCK_SM))

    def power_limit_w(self) -> float | None:
        """The enforced power limit (W), the cap the clock falls to hold."""
        if not self.available:
            return None
        return self._read(lambda: self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle), 1e-3)

    def power_w(self) -> float | None:
        if not self.available:
            return None
        return self._read(lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle), 1e-3)

    def sample(self) -> GpuSample:
        """The SM and memory clocks (MHz), power (W), temperature (C) and throttle bitmask."""
        if not self.available:
            return empty_sample()
        nvml, h = self.nvml, self.handle
        throttle = self._read(lambda: _throttle_reasons(nvml, h))
        return {
            "sm_mhz": self.sm_mhz(),
            "mem_mhz": self._read(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            "power_w": self._read(lambda: nvml.nvmlDeviceGetPowerUsage(h), 1e-3),  # mW
            "temp_c": self._read(lambda: nvml.nvmlDeviceGetTemperature(
                h, nvml.NVML_TEMPERATURE_GPU)),
            "throttle": int(throttle) if throttle is not None else None,
        }


def _throttle_reasons(nvml: Any, handle: Any) -> int:
    """NVML renamed "clocks throttle reasons" to "clocks event reasons" (12.x); a driver older
    than the binding lacks the new function: the old one then."""
    new = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if new is not None:
        try:
            return int(new(handle))
        except Exception:  # noqa: BLE001 - not in this driver
            pass
    return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def open_monitor(uuid: str | None = None, pci_bus_id: str | None = None,
                 nvml: Any = None) -> GpuMonitor:
    """A monitor of the GPU with this UUID (``GPU-...``; a MIG instance's ``MIG-...`` reads no
    clocks, so then its PCI bus id, the physical GPU's, is used) or PCI bus id
    (``domain:bus:device.function``, hex). ``nvml``: the pynvml module (imported when None).
    Never raises: without NVML, or without a matching GPU, every field reads None."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return GpuMonitor()
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver library (a CPU machine): no readings
        return GpuMonitor()
    lookups = ((nvml.nvmlDeviceGetHandleByUUID, uuid),
               (nvml.nvmlDeviceGetHandleByPciBusId, pci_bus_id))
    for lookup, key in lookups:
        if not key:
            continue
        try:
            monitor = GpuMonitor(nvml, lookup(key))
        except Exception:  # noqa: BLE001 - not found by this key: the next one
            continue
        if monitor.sm_mhz() is not None:
            return monitor
    return GpuMonitor(nvml, None)


def torch_device_ids(index: int = 0) -> tuple[str | None, str | None]:
    """The UUID (as nvidia-smi writes it) and PCI bus id of torch's CUDA device ``index``."""
    import torch

    props = torch.cuda.get_device_properties(index)
    raw = getattr(props, "uuid", None)
    uuid = None if raw is None else str(raw)
    if uuid is not None and not uuid.startswith(("GPU-", "MIG-")):
        uuid = f"GPU-{uuid}"
    bus = getattr(props, "pci_bus_id", None)
    pci = None if bus is None else (f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:"
                                    f"{getattr(props, 'pci_device_id', 0):02x}.0")
    return uuid, pci


def monitor_for_torch_device(index: int = 0) -> GpuMonitor:
    """The monitor of torch's CUDA device ``index`` (the child's GPU is its device 0)."""
    try:
        uuid, pci = torch_device_ids(index)
    except Exception:  # noqa: BLE001 - no CUDA here
        return GpuMonitor()
    return open_monitor(uuid, pci)


def merge_samples(samples: Sequence[GpuSample]) -> GpuSample:
    """One state for several timings (a re-timed config's rounds): each reading's median,
    the throttle bits of every sample together."""
    merged = empty_sample()
    for name in GPU_FIELDS:
        values = [s[name] for s in samples if s.get(name) is not None]
        if not values:
            continue
        if name == "throttle":
            mask = 0
            for v in values:
                mask |= int(v or 0)
            merged[name] = mask
        else:
            merged[name] = float(statistics.median(float(v or 0) for v in values))
    return merged


def is_flat(samples: Sequence[tuple[float, float]], now_s: float, window_s: float,
            drop_mhz: float) -> bool:
    """Whether the SM clock stopped falling: the mean of the samples (seconds, MHz) in the
    window's last quarter is less than ``drop_mhz`` under the mean of those in its first
    quarter. False until a full window of samples exists."""
    if now_s < window_s:
        return False
    early = [mhz for t, mhz in samples if now_s - window_s <= t <= now_s - 0.75 * window_s]
    late = [mhz for t, mhz in samples if t >= now_s - 0.25 * window_s]
    if not early or not late:
        return False
    return statistics.fmean(early) - statistics.fmean(late) < drop_mhz


#: the settle loop launches the load in batches of about this many seconds between readings
SETTLE_BATCH_S = 0.05


def settle(load: Callable[[], None], sync: Callable[[], None], monitor: GpuMonitor,
           timing: TimingOptions, clock: Callable[[], float] = time.monotonic
           ) -> dict[str, Any]:
    """Run ``load`` (one launch; ``sync`` waits for the GPU) until the SM clock stops falling
    (see the module docstring). Returns what was done: ``ms`` run, the first and last SM clock
    read (None without NVML) and ``why`` it stopped: ``flat``, ``max`` (``settle_max_ms``
    reached while still falling) or ``blind`` (no clock reading: ran ``settle_max_ms``)."""
    max_s = timing.settle_max_ms / 1e3
    window_s = timing.settle_window_ms / 1e3
    drop = timing.settle_drop_mhz
    start = clock()
    samples: list[tuple[float, float]] = []
    first = monitor.sm_mhz()
    batch, now = 1, 0.0
    while now < max_s:
        t0 = clock()
        for _ in range(batch):
            load()
        sync()
        if clock() - t0 < SETTLE_BATCH_S:
            batch *= 2
        now = clock() - start
        mhz = monitor.sm_mhz()
        if mhz is not None:
            samples.append((now, mhz))
            if is_flat(samples, now, window_s, drop):
                return {"ms": now * 1e3, "sm_mhz_first": first, "sm_mhz": mhz, "why": "flat"}
    last = samples[-1][1] if samples else None
    return {"ms": now * 1e3, "sm_mhz_first": first, "sm_mhz": last,
            "why": "max" if samples else "blind"}


#: how often (seconds) ``cool_down`` reads the power while it waits
COOL_POLL_S = 0.02


def cool_down(monitor: GpuMonitor, timing: TimingOptions,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """The ``cool`` protocol's wait before one timing: leave the GPU idle until its power
    reading is at most ``cool_power_frac`` of the enforced power limit (far from the cap, so
    the timing starts at the boost clock), at most ``cool_max_ms``. Returns ``ms`` waited, the
    power read first and last (None without NVML: then it does not wait) and ``why`` it
    stopped: ``cool`` (under the threshold), ``max`` (still over it) or ``blind``."""
    limit = monitor.power_limit_w()
    first = monitor.power_w()
    if limit is None or first is None:
        return {"ms": 0.0, "power_w_first": first, "power_w": first, "why": "blind"}
    threshold = timing.cool_power_frac * limit
    max_s = timing.cool_max_ms / 1e3
    start = clock()
    power: float | None = first
    while power is not None and power > threshold:
        if clock() - start >= max_s:
            return {"ms": (clock() - start) * 1e3, "power_w_first": first, "power_w": power,
                    "why": "max"}
        sleep(COOL_POLL_S)
        power = monitor.power_w()
    return {"ms": (clock() - start) * 1e3, "power_w_first": first, "power_w": power,
            "why": "cool"}
