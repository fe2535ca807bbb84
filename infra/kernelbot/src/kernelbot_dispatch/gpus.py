"""The GPUs the service serves, named as kernelbot names them, and how kernelbot learns them.

kernelbot main finds a GPU by name in ``libkernelbot.consts._GPU_LOOKUP`` (built once, at
import, from its own enums) and its CUDA architecture in ``GPU_TO_SM``; both are read where
they are, so :func:`register_gpus` adds ours to them in place.
"""

from __future__ import annotations

import enum
from types import ModuleType
from typing import Any

try:
    from libkernelbot.consts import BuildkiteGPU as DispatchGPU
except ImportError:  # kernelbot main has no such enum (its Buildkite branches had)

    class DispatchGPU(enum.Enum):  # type: ignore[no-redef]
        """The GPUs the service's default ``GPU_QUEUES`` serves."""

        B200_BK = "B200_BK"
        H100_BK = "H100_BK"
        MI300_BK = "MI300_BK"
        L40S_BK = "L40S_BK"


__all__ = ["GPU_TO_SM", "RUNNER", "DispatchGPU", "register_gpus"]

#: Each GPU's CUDA architecture for kernelbot's compile flags (None: not CUDA).
GPU_TO_SM: dict[str, str | None] = {
    "B200_BK": "100",
    "H100_BK": "90a",
    "MI300_BK": None,
    "L40S_BK": "89",
}

#: The name kernelbot records as these GPUs' runner.
RUNNER = "Dispatch"


def register_gpus(
    gpus: type[enum.Enum] = DispatchGPU,
    sm: dict[str, str | None] | None = None,
    consts: ModuleType | Any = None,
) -> None:
    """Teaches kernelbot's GPU lookup and ``GPU_TO_SM`` the names in ``gpus`` (their
    architectures from ``sm``, else :data:`GPU_TO_SM`). Refuses, changing nothing, a name
    kernelbot already has or one without an architecture entry."""
    if consts is None:
        from libkernelbot import consts as kernelbot_consts

        consts = kernelbot_consts
    archs = {**GPU_TO_SM, **(sm or {})}
    missing = [g.name for g in gpus if g.name not in archs]
    if missing:
        raise ValueError(f"no architecture (GPU_TO_SM) for {', '.join(missing)}")
    lookup = consts._make_gpu_lookup({RUNNER: gpus})
    clash = sorted(set(lookup) & set(consts._GPU_LOOKUP))
    if clash:
        raise ValueError(f"kernelbot already has GPUs named {', '.join(clash)}")
    consts._GPU_LOOKUP.update(lookup)
    consts.GPU_TO_SM.update({g.name: archs[g.name] for g in gpus})
