"""Device detection in the real measuring child: its fingerprint (name, compute capability, SM
count, memory, UUID, driver) against nvidia-smi, and the GPU it picks under
CUDA_VISIBLE_DEVICES (indices, UUIDs, an index past the list)."""

from __future__ import annotations

import pytest
import torch
import triton

from tests.gpu.smi import Gpu
from tests.gpu.specs import spec_of
from tuner.backends.process import ProcessBackend
from tuner.device import DeviceFingerprint, count_gpus_without_init, visible_device_for
from tuner.errors import WorkerDied

pytestmark = pytest.mark.gpu

#: a tiny real Triton kernel (bench/gpu_faults.py, MODE=0 is out = 2 * x)
FAULTY = "bench.gpu_faults:KERNEL"


def child_fingerprint(device_index: int = 0) -> DeviceFingerprint:
    """What the measuring child detects (no compile pool: only the child starts)."""
    backend = ProcessBackend("cuda", FAULTY, {"N": 4096}, "float32",
                             device_index=device_index, compile_workers=0)
    try:
        return backend.fingerprint
    finally:
        backend.close()


def test_the_child_fingerprints_the_first_visible_gpu(cuda_machine: list[Gpu]):
    gpu = cuda_machine[0]
    fp = child_fingerprint()
    assert fp.kind == "cuda" and fp.is_gpu
    assert fp.name == gpu.name and fp.uuid == gpu.uuid
    assert fp.compute_capability == gpu.compute_cap
    assert fp.key == f"cuda:{gpu.name}:sm{gpu.compute_cap.replace('.', '')}"
    assert fp.memory_bytes is not None
    assert abs(fp.memory_bytes / 2**20 - gpu.memory_mib) <= 0.02 * gpu.memory_mib
    spec = spec_of(gpu.name)
    assert fp.sm_count == (spec.sm_count if spec else fp.sm_count) and (fp.sm_count or 0) > 0
    # the opt-in shared memory per block: 227 KiB on Hopper, 163 KiB on the A100
    assert fp.smem_per_block is not None and 48 * 1024 < fp.smem_per_block <= 256 * 1024
    assert fp.driver_version == gpu.driver  # read through NVML (pynvml)
    assert (fp.triton_version, fp.torch_version, fp.cuda_version) == (
        triton.__version__, torch.__version__, torch.version.cuda)


def test_cuda_visible_devices_as_the_child_sees_it(cuda_machine: list[Gpu],
                                                   monkeypatch: pytest.MonkeyPatch):
    uuids = [g.uuid for g in cuda_machine]
    last = cuda_machine[-1]
    # by UUID, in reverse: the worker's device 0 is the last visible GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(reversed(uuids)))
    assert count_gpus_without_init() == len(uuids)
    assert visible_device_for(0) == last.uuid
    assert child_fingerprint(0).uuid == last.uuid
    if len(uuids) > 1:
        assert child_fingerprint(len(uuids) - 1).uuid == cuda_machine[0].uuid
    # by nvidia-smi's index (PCI bus order, which CUDA follows under CUDA_DEVICE_ORDER)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", last.index)
    assert child_fingerprint(0).uuid == last.uuid
    # a list that stops at -1: CUDA sees the entries before it only
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{last.uuid},-1,{cuda_machine[0].uuid}")
    assert count_gpus_without_init() == 1
    with pytest.raises(WorkerDied, match=r"device index 1: .* makes 1 device\(s\) visible"):
        child_fingerprint(1)
