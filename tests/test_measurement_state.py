"""Measurements you can trust (issue 12): GPU state with every timing, the settled timing
protocol, the interleaved torch baseline, the incumbent re-timed beside the finalists, and the
calibration's medians and spreads. CPU only: NVML cannot exist here, so it alone is faked."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from search_spaces import get_kernel
from tests.fakes.faulty import GOOD, WRONG
from tests.fakes.faulty import KERNEL as FAULTY
from tuner import gpu_state
from tuner.backends import TimingOptions
from tuner.backends import child as child_mod
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.measurement import Outcome
from tuner.search import SearchOptions, run_search

FIELDS = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle")
FAST = TimingOptions(compile_timeout_s=30, run_timeout_s=30, start_timeout_s=60)


# -- GPU state through NVML ---------------------------------------------------------------------

class FakeNVMLError(Exception):
    pass


def fake_nvml(devices: dict[str, dict[str, Any]], by_pci: dict[str, str],
              old_names: bool = False) -> SimpleNamespace:
    """The few pynvml calls gpu_state makes, over ``devices`` (UUID -> readings; a reading
    that is an exception is raised, as NVML raises NOT_SUPPORTED)."""
    def get(handle: str, name: str) -> Any:
        value = devices[handle][name]
        if isinstance(value, Exception):
            raise value
        return value

    def by_uuid(uuid: str) -> str:
        if uuid not in devices:
            raise FakeNVMLError("NVML_ERROR_NOT_FOUND")
        return uuid

    def by_bus(bus: str) -> str:
        if bus not in by_pci:
            raise FakeNVMLError("NVML_ERROR_NOT_FOUND")
        return by_pci[bus]

    nvml = SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0, NVMLError=FakeNVMLError,
        nvmlInit=lambda: None, nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetHandleByPciBusId=by_bus,
        nvmlDeviceGetClockInfo=lambda h, which: get(h, {1: "sm", 2: "mem"}[which]),
        nvmlDeviceGetPowerUsage=lambda h: get(h, "mw"),
        nvmlDeviceGetTemperature=lambda h, sensor: get(h, "temp"),
    )
    reasons = lambda h: get(h, "reasons")  # noqa: E731
    if old_names:  # NVML before 12: only the "throttle reasons" name
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons = reasons
    else:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = reasons
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0
    return nvml


H200 = {"sm": 1470, "mem": 3201, "mw": 691_500, "temp": 71, "reasons": 0x4 | 0x20}


def test_without_nvml_every_field_is_none():
    # the real pynvml here: no driver library, nvmlInit fails; torch is the CPU build
    for monitor in (gpu_state.open_monitor("GPU-1234", "00000000:1b:00.0"),
                    gpu_state.monitor_for_torch_device(0)):
        assert not monitor.available
        assert monitor.sample() == dict.fromkeys(FIELDS)
        assert monitor.sm_mhz() is None
    assert gpu_state.open_monitor(nvml=SimpleNamespace(nvmlInit=lambda: 1 / 0)).sample() == {
        name: None for name in FIELDS}


def test_a_fake_nvml_is_read_by_uuid_in_watts_and_mhz():
    nvml = fake_nvml({"GPU-aa": H200, "GPU-bb": {**H200, "sm": 1980}}, {})
    sample = gpu_state.open_monitor("GPU-aa", None, nvml=nvml).sample()
    assert sample == {"sm_mhz": 1470.0, "mem_mhz": 3201.0, "power_w": pytest.approx(691.5),
                      "temp_c": 71.0, "throttle": 0x24}
    assert gpu_state.throttle_reasons(sample["throttle"]) == ["sw_power_cap",
                                                              "sw_thermal_slowdown"]
    assert gpu_state.open_monitor("GPU-bb", None, nvml=nvml).sm_mhz() == 1980.0


def test_the_pci_bus_id_is_used_when_the_uuid_reads_no_clock():
    # a MIG instance's handle answers no clock queries: the physical GPU's (by bus id) does
    mig = {**H200, "sm": FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")}
    nvml = fake_nvml({"MIG-1": mig, "GPU-aa": H200}, {"00000000:1b:00.0": "GPU-aa"})
    assert gpu_state.open_monitor("MIG-1", "00000000:1b:00.0", nvml=nvml).sm_mhz() == 1470.0
    assert gpu_state.open_monitor("GPU-zz", "00000000:1b:00.0", nvml=nvml).sm_mhz() == 1470.0
    nowhere = gpu_state.open_monitor("GPU-zz", "00000000:99:00.0", nvml=nvml)
    assert not nowhere.available and nowhere.sample() == dict.fromkeys(FIELDS)


def test_unsupported_readings_are_none_and_old_nvml_names_work():
    no_power = {**H200, "mw": FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")}
    nvml = fake_nvml({"GPU-aa": no_power}, {}, old_names=True)
    sample = gpu_state.open_monitor("GPU-aa", nvml=nvml).sample()
    assert sample["power_w"] is None and sample["throttle"] == 0x24 and sample["sm_mhz"] == 1470
    # a binding newer than the driver: the new name raises, the old one answers
    nvml = fake_nvml({"GPU-aa": H200}, {}, old_names=True)
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 1 / 0
    assert gpu_state.open_monitor("GPU-aa", nvml=nvml).sample()["throttle"] == 0x24


def test_merge_samples_takes_medians_and_every_throttle_bit():
    samples = [{"sm_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 500.0, "temp_c": 60.0,
                "throttle": 0},
               {"sm_mhz": 1470.0, "mem_mhz": 3201.0, "power_w": 692.0, "temp_c": 70.0,
                "throttle": 0x4},
               {"sm_mhz": 1500.0, "mem_mhz": None, "power_w": 690.0, "temp_c": 72.0,
                "throttle": 0x20}]
    assert gpu_state.merge_samples(samples) == {"sm_mhz": 1500.0, "mem_mhz": 3201.0,
                                                "power_w": 690.0, "temp_c": 70.0,
                                                "throttle": 0x24}
    assert gpu_state.merge_samples([]) == dict.fromkeys(FIELDS)


# -- the settled sustained state ----------------------------------------------------------------

class FakeGpu:
    """A clock that advances 50 ms per launch and an SM clock that follows ``mhz(t)``."""

    def __init__(self, mhz: Any) -> None:
        self.t, self.mhz, self.launches = 0.0, mhz, 0

    def clock(self) -> float:
        return self.t

    def launch(self) -> None:
        self.t += 0.05
        self.launches += 1

    def monitor(self) -> Any:
        return SimpleNamespace(sm_mhz=lambda: self.mhz(self.t))


def test_settle_runs_until_the_clock_stops_falling():
    # 1980 MHz falling 150 MHz/s to the 1470 MHz power-cap clock (at 3.4 s), then flat
    gpu = FakeGpu(lambda t: max(1470.0, 1980.0 - 150.0 * t))
    timing = TimingOptions(settle_max_ms=20000, settle_window_ms=1000, settle_drop_mhz=15)
    done = gpu_state.settle(gpu.launch, lambda: None, gpu.monitor(), timing, clock=gpu.clock)
    assert done["why"] == "flat" and done["sm_mhz"] == 1470.0
    assert done["sm_mhz_first"] == 1980.0
    # not before the fall ended, and within about a window of it
    assert 3400 <= done["ms"] <= 3400 + 1000 + 100


def test_settle_stops_at_its_limit_and_runs_blind_without_a_clock():
    timing = TimingOptions(settle_max_ms=2000, settle_window_ms=500, settle_drop_mhz=15)
    falling = FakeGpu(lambda t: 1980.0 - 100.0 * t)
    done = gpu_state.settle(falling.launch, lambda: None, falling.monitor(), timing,
                            clock=falling.clock)
    assert done["why"] == "max" and 2000 <= done["ms"] < 2100
    blind = FakeGpu(lambda t: None)
    done = gpu_state.settle(blind.launch, lambda: None, blind.monitor(), timing,
                            clock=blind.clock)
    assert done == {"ms": pytest.approx(2000, abs=60), "sm_mhz_first": None, "sm_mhz": None,
                    "why": "blind"}


def test_is_flat_compares_the_window_s_first_and_last_quarters():
    falling = [(t / 10, 1980.0 - 20.0 * t / 10) for t in range(21)]  # 20 MHz/s
    assert not gpu_state.is_flat(falling, 0.9, 1.0, 15.0)  # no full window yet
    assert gpu_state.is_flat(falling, 2.0, 1.0, 25.0)
    assert not gpu_state.is_flat(falling, 2.0, 1.0, 15.0)


# -- the cool protocol ------------------------------------------------------------------------

class CoolingGpu:
    """Power that decays from ``start_w`` toward idle while the caller sleeps."""

    def __init__(self, start_w: float, limit_w: float | None, decay_w_per_s: float) -> None:
        self.t, self.start, self.limit, self.decay = 0.0, start_w, limit_w, decay_w_per_s

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s

    def monitor(self) -> Any:
        return SimpleNamespace(power_limit_w=lambda: self.limit,
                               power_w=lambda: max(100.0, self.start - self.decay * self.t))


def test_cool_down_waits_until_the_power_is_far_from_the_cap():
    gpu = CoolingGpu(start_w=690.0, limit_w=700.0, decay_w_per_s=500.0)
    timing = TimingOptions(protocol="cool", cool_power_frac=0.5, cool_max_ms=3000)
    done = gpu_state.cool_down(gpu.monitor(), timing, clock=gpu.clock, sleep=gpu.sleep)
    # 690 W falls under 350 W after 0.68 s; it waits in 20 ms steps
    assert done["why"] == "cool" and 680 <= done["ms"] <= 700
    assert done["power_w_first"] == 690.0 and done["power_w"] <= 350.0


def test_cool_down_gives_up_at_its_limit_and_does_not_wait_blind():
    hot = CoolingGpu(start_w=690.0, limit_w=700.0, decay_w_per_s=10.0)
    timing = TimingOptions(protocol="cool", cool_power_frac=0.5, cool_max_ms=1000)
    done = gpu_state.cool_down(hot.monitor(), timing, clock=hot.clock, sleep=hot.sleep)
    assert done["why"] == "max" and 1000 <= done["ms"] < 1040 and done["power_w"] > 350.0
    blind = CoolingGpu(start_w=690.0, limit_w=None, decay_w_per_s=10.0)
    done = gpu_state.cool_down(blind.monitor(), timing, clock=blind.clock, sleep=blind.sleep)
    assert done["why"] == "blind" and done["ms"] == 0.0 and blind.t == 0.0


def test_the_protocol_comes_from_the_environment_and_a_wrong_name_is_refused(monkeypatch):
    monkeypatch.delenv("TUNER_TIMING_PROTOCOL", raising=False)
    assert TimingOptions().protocol == "settled" and TimingOptions().settles
    monkeypatch.setenv("TUNER_TIMING_PROTOCOL", "cool")
    opts = TimingOptions()
    assert opts.protocol == "cool" and opts.cools and not opts.settles
    state = child_mod.ChildState("cuda")
    assert not child_mod.settle_due(state, opts, now=0.0)  # cooling, never settling
    monkeypatch.setenv("TUNER_TIMING_PROTOCOL", "boost")
    with pytest.raises(ValueError):
        TimingOptions()
    monkeypatch.setenv("TUNER_TIMING_PROTOCOL", "boost")
    with pytest.raises(ValueError, match="TUNER_TIMING_PROTOCOL='boost'.*settled, cool, none"):
        TimingOptions()


def test_settled_full_timings_warm_up_long_enough_for_the_power_limiter():
    settled = TimingOptions(protocol="settled", warmup_ms=10, settle_warmup_ms=100)
    assert settled.settles and child_mod._full_warmup_ms(settled) == 100
    assert child_mod._full_warmup_ms(settled, idle_s=0.3) == 100  # idled: boost regained
    # back to back (a re-timing's rounds): the clock is already at its sustained level
    assert child_mod._full_warmup_ms(settled, idle_s=0.005) == 10
    for other in ("cool", "none"):
        opts = TimingOptions(protocol=other, warmup_ms=10, settle_warmup_ms=100)
        assert not opts.settles and child_mod._full_warmup_ms(opts) == 10
    # the long until-flat settle is off by default; the warm-up alone settles
    assert not child_mod._settles(TimingOptions(protocol="settled"))
    assert child_mod._settles(TimingOptions(protocol="settled", settle_max_ms=5000))


def test_settling_is_due_first_and_after_idle_only_on_a_gpu():
    timing = TimingOptions(settle_max_ms=5000, resettle_idle_s=3.0)
    state = child_mod.ChildState("cuda")
    assert child_mod.settle_due(state, timing, now=100.0)
    state.settled, state.last_busy = True, 99.0
    assert not child_mod.settle_due(state, timing, now=100.0)
    assert child_mod.settle_due(state, timing, now=102.5)
    assert not child_mod.settle_due(state, TimingOptions(settle_max_ms=0), now=102.5)
    assert not child_mod.settle_due(child_mod.ChildState("interpret"), timing, now=0.0)


# -- re-timing: round-robin, with the baseline ---------------------------------------------------

class Recording:
    """A kernel that records what ran, in order: config launches by X, the baseline."""

    def __init__(self, baseline_fails: bool = False) -> None:
        self.log: list[Any] = []
        self.baseline_fails = baseline_fails

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        return {}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        self.log.append(config["X"])

    def baseline(self, inputs: dict[str, Any]) -> None:
        self.log.append("torch")
        if self.baseline_fails:
            raise RuntimeError("no such op on this device")


def recording_state(kernel: Recording) -> child_mod.ChildState:
    state = child_mod.ChildState("interpret")
    state.kernel = kernel
    return state


def test_retime_times_every_finalist_and_the_baseline_once_per_round():
    kernel = Recording()
    configs = [KernelConfig(X=1), KernelConfig(X=2)]
    out = child_mod.retime(recording_state(kernel), configs, 2, FAST, baseline=True)
    # one trial call of the baseline, then per round: each config, then the baseline (the CPU
    # timer runs each three times)
    one_round = [1] * 3 + [2] * 3 + ["torch"] * 3
    assert kernel.log == ["torch"] + one_round * 2
    assert [m.config for m in out] == configs + [KernelConfig({})]
    assert [m.extra.get("baseline") for m in out] == [None, None, "torch"]
    assert all(m.ok and m.extra["measured"] == "retimed" and m.extra["rounds"] == 2
               for m in out)
    assert all("gpu" not in m.extra for m in out)  # the interpreter has no GPU state


def test_retime_without_baseline_or_with_a_failing_one_times_the_configs_only():
    kernel = Recording()
    out = child_mod.retime(recording_state(kernel), [KernelConfig(X=1)], 2, FAST)
    assert kernel.log == [1] * 6 and [m.config for m in out] == [KernelConfig(X=1)]
    failing = Recording(baseline_fails=True)
    out = child_mod.retime(recording_state(failing), [KernelConfig(X=1)], 1, FAST,
                           baseline=True)
    assert failing.log == ["torch", 1, 1, 1] and len(out) == 1


# -- the search loop: incumbent and baseline, through the real child on the interpreter ----------

@pytest.mark.timeout(300)
def test_the_search_retimes_the_incumbent_and_the_torch_baseline_beside_its_finalists():
    kernel = get_kernel("softmax")
    shape, dtype = {"M": 4, "N": 64}, "float32"
    good = kernel.known_good_configs(shape, dtype)
    warm, incumbent = good[:3], good[4]
    assert incumbent not in warm
    backend = ProcessBackend("interpret", kernel.ref, shape, dtype, timing=FAST,
                             compile_workers=0)
    stored: list[Any] = []
    try:
        result = run_search(kernel, shape, dtype, backend,
                            SearchOptions(trials=3, warm_start=warm, incumbent=incumbent,
                                          retime_rounds=2),
                            on_trial=lambda n, m: stored.append(m.config))
    finally:
        backend.close()
    # the incumbent was verified and re-timed, but is not a trial of this search
    assert [m.config for m in result.trials] == warm == stored
    assert result.incumbent is not None and result.incumbent.config == incumbent
    assert result.incumbent.ok and result.incumbent.extra["measured"] == "retimed"
    assert result.incumbent.max_error is not None  # it was verified
    # the baseline: torch.softmax on the CPU, timed in the same rounds
    assert result.baseline is not None and result.baseline.config == KernelConfig({})
    assert result.baseline.extra["baseline"] == "torch" and (result.baseline.p50_ms or 0) > 0
    assert {m.config for m in result.finalists} == set(warm)
    assert all(m.extra["measured"] == "retimed" for m in result.finalists)
    assert all(m.extra["measured"] == "trial" for m in result.trials)
    assert result.best in result.finalists


@pytest.mark.timeout(120)
def test_an_incumbent_that_no_longer_verifies_comes_back_as_its_failure():
    backend = ProcessBackend("interpret", FAULTY.ref, {"N": 100}, "float32", timing=FAST,
                             compile_workers=0)
    try:
        result = run_search(FAULTY, {"N": 100}, "float32", backend,
                            SearchOptions(trials=2, strategy="exhaustive",
                                          warm_start=[KernelConfig(MODE=GOOD, SLOW=1),
                                                      KernelConfig(MODE=GOOD, SLOW=2)],
                                          incumbent=KernelConfig(MODE=WRONG, SLOW=1)))
    finally:
        backend.close()
    assert len(result.trials) == 2 and result.best is not None
    assert result.incumbent is not None
    assert result.incumbent.outcome is Outcome.WRONG_RESULT
    assert result.baseline is None  # the fake kernel has no baseline hook


# -- calibration arithmetic ---------------------------------------------------------------------

def test_calibration_reports_the_median_of_runs_and_their_spread():
    runs = [642.0, 714.0, 690.0, 705.0, 700.0]  # the 642-714 TFLOP/s across runs
    median, spread = child_mod.median_spread(runs)
    assert median == 700.0 and spread == pytest.approx((714.0 - 642.0) / 700.0)
    # the ceiling is the best median of the vendor GEMMs tried, with that GEMM's spread
    gemms = {("bfloat16", 8192): [700.0, 705.0, 710.0],
             ("float16", 16384): [760.0, 790.0, 770.0],
             ("bfloat16", 16384): [800.0, 600.0, 650.0]}  # one lucky run does not win
    assert child_mod.best_median(gemms) == (770.0, pytest.approx(30.0 / 770.0))
    assert child_mod.median_spread([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError):
        child_mod.median_spread([])
    assert statistics.median(runs) == median
