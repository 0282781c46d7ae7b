"""A stand-in for a ROCm build of PyTorch on an AMD GPU, which cannot exist on the test machine.

It implements the slice of the real `torch` / `torch.cuda` API that rocmdoctor's GPU probe calls,
with the same names, signatures and exception types, and behaves as the device described by the
JSON file in $FAKE_TORCH_GPU: its properties, free memory (allocations really count against it and
fail with torch.OutOfMemoryError beyond it), the device time a matmul or a copy takes (event
timing), and faults: a device that vanishes or a runtime that hangs in a named stage.
"""

import json
import os
import time
from types import SimpleNamespace

_GPU = json.loads(open(os.environ["FAKE_TORCH_GPU"]).read())
if _GPU.get("chatter"):
    # Real runtimes print banners and warnings on stdout, from Python and from native code.
    print("torch: a warning on stdout")
    os.write(1, b"HIP: a native banner on stdout\n")

__version__ = _GPU["torch_version"]
version = SimpleNamespace(hip=_GPU.get("hip"), cuda=_GPU.get("cuda"))
uint8 = SimpleNamespace(itemsize=1, name="uint8")
bfloat16 = SimpleNamespace(itemsize=2, name="bfloat16")

_state = {"allocated": 0, "clock_ms": 0.0, "mem_get_info_calls": 0}


class OutOfMemoryError(RuntimeError):
    pass


def _fault(stage):
    """The configured fault, when the probe reaches `stage` (memory, compute)."""
    if _GPU.get("hang_in") == stage:
        time.sleep(3600)
    if _GPU.get("vanish_in") == stage:
        raise RuntimeError("HIP error: no ROCm-capable device is detected")


class Tensor:
    def __init__(self, nbytes, dtype):
        free = _GPU["free"] - _state["allocated"]
        limit = _GPU.get("allocation_limit", free)
        if nbytes > min(free, limit):
            raise OutOfMemoryError(
                f"HIP out of memory. Tried to allocate {nbytes / 2**30:.2f} GiB. "
                f"GPU 0 has a total capacity of {_GPU['devices'][0]['total_memory'] / 2**30:.2f} GiB "
                f"of which {free / 2**30:.2f} GiB is free."
            )
        self.nbytes, self.dtype, self._owner = nbytes, dtype, True
        _state["allocated"] += nbytes

    def __del__(self):
        if self._owner:
            _state["allocated"] -= self.nbytes

    def _view(self):
        view = object.__new__(Tensor)
        view.nbytes, view.dtype, view._owner = 0, self.dtype, False
        return view

    def __getitem__(self, _index):
        return self._view()

    def fill_(self, _value):
        return self

    def random_(self, _low, _high):
        return self

    def copy_(self, _src):
        _fault("compute")
        _state["clock_ms"] += _GPU["copy_ms"]
        return self


def _bytes(shape, dtype):
    count = 1
    for n in shape:
        count *= n
    return count * dtype.itemsize


def empty(*shape, dtype=None, device=None):
    return Tensor(_bytes(shape, dtype or uint8), dtype or uint8)


def zeros(*shape, dtype=None, device=None):
    return empty(*shape, dtype=dtype, device=device)


def randn(*shape, dtype=None, device=None):
    return empty(*shape, dtype=dtype, device=device)


def empty_like(other):
    return Tensor(other.nbytes, other.dtype)


def matmul(_a, _b, out=None):
    _fault("compute")
    _state["clock_ms"] += _GPU["matmul_ms"]
    return out


def equal(_a, _b):
    return not _GPU.get("corrupt_copy", False)


class _Cuda:
    OutOfMemoryError = OutOfMemoryError

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = _state["clock_ms"]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    @staticmethod
    def is_available():
        return bool(_GPU["devices"])

    @staticmethod
    def device_count():
        return len(_GPU["devices"])

    @staticmethod
    def get_device_name(index=0):
        return _GPU["devices"][index]["name"]

    @staticmethod
    def get_device_properties(index=0):
        return SimpleNamespace(**_GPU["devices"][index])

    @staticmethod
    def mem_get_info(device=0):
        _fault("memory")
        _state["mem_get_info_calls"] += 1
        if _GPU.get("vanish_after_mem_get_info") == _state["mem_get_info_calls"]:
            raise RuntimeError("HIP error: no ROCm-capable device is detected")
        return _GPU["free"] - _state["allocated"], _GPU["devices"][device]["total_memory"]

    @staticmethod
    def synchronize(device=None):
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def set_device(device):
        pass


cuda = _Cuda()
