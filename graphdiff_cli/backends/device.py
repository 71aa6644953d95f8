"""Device choice: "auto" picks a GPU only where one actually works, else the CPU."""

from __future__ import annotations

from functools import lru_cache

from ..errors import BackendError, InvalidArgumentError

DEVICES = ("auto", "cpu", "cuda")


def check_device_name(device: str) -> str:
    if device in DEVICES or (isinstance(device, str) and device.startswith("cuda:")):
        return device
    raise InvalidArgumentError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")


@lru_cache(maxsize=None)
def cuda_works() -> bool:
    """True when torch sees a CUDA device and a tiny kernel runs on it (a driver can be present but broken)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        x = torch.ones(4, device="cuda")
        return float((x * 2).sum().item()) == 8.0
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU"
        return False


def resolve_device(device: str = "auto"):
    """Map "auto" | "cpu" | "cuda" | "cuda:N" to a torch.device, refusing "cuda" where none works."""
    import torch

    check_device_name(device)
    if device == "cpu":
        return torch.device("cpu")
    if device == "auto":
        return torch.device("cuda") if cuda_works() else torch.device("cpu")
    if not cuda_works():
        raise BackendError(f"device {device!r} was requested but no working CUDA GPU was found; "
                           "use --device cpu or --device auto")
    return torch.device(device)
