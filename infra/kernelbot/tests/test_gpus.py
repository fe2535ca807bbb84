"""``register_gpus`` against a module shaped as kernelbot main's ``libkernelbot.consts``."""

from __future__ import annotations

import dataclasses
import enum
import types

import pytest

from kernelbot_dispatch import GPU_TO_SM, DispatchGPU, register_gpus


@dataclasses.dataclass
class GPU:
    name: str
    value: str
    runner: str


def kernelbot_consts() -> types.SimpleNamespace:
    """kernelbot main's lookup as consts.py builds it: lowercased member names to ``GPU``."""

    class ModalGPU(enum.Enum):
        H100 = "H100"
        B200 = "B200"

    def make_lookup(runner_map: dict[str, type[enum.Enum]]) -> dict[str, GPU]:
        lookup: dict[str, GPU] = {}
        for runner, gpus in runner_map.items():
            for name, member in gpus.__members__.items():
                if name.lower() in lookup:
                    raise ValueError(f"Duplicate gpu name '{name}' found across Enums.")
                lookup[name.lower()] = GPU(name=name, value=member.value, runner=runner)
        return lookup

    return types.SimpleNamespace(
        _make_gpu_lookup=make_lookup,
        _GPU_LOOKUP=make_lookup({"Modal": ModalGPU}),
        GPU_TO_SM={"H100": "90a", "B200": "100"},
    )


def test_registered_gpus_are_found_by_name_and_have_an_architecture() -> None:
    consts = kernelbot_consts()
    lookup, sm = consts._GPU_LOOKUP, consts.GPU_TO_SM
    register_gpus(consts=consts)
    assert consts._GPU_LOOKUP is lookup and consts.GPU_TO_SM is sm, "updated in place"
    assert consts._GPU_LOOKUP["h100_bk"] == GPU("H100_BK", "H100_BK", "Dispatch")
    assert consts._GPU_LOOKUP["h100"].runner == "Modal"
    assert {g.name for g in DispatchGPU} <= set(consts.GPU_TO_SM)
    assert consts.GPU_TO_SM["H100_BK"] == GPU_TO_SM["H100_BK"] == "90a"
    assert consts.GPU_TO_SM["MI300_BK"] is None


def test_a_multi_gpu_queue_s_name_needs_its_architecture() -> None:
    class Eight(enum.Enum):
        MI300x8_BK = "MI300x8_BK"

    consts = kernelbot_consts()
    with pytest.raises(ValueError, match=r"no architecture .* MI300x8_BK"):
        register_gpus(Eight, consts=consts)
    register_gpus(Eight, sm={"MI300x8_BK": None}, consts=consts)
    assert consts._GPU_LOOKUP["mi300x8_bk"].runner == "Dispatch"


def test_a_name_kernelbot_has_already_is_refused_and_nothing_changes() -> None:
    class Clashing(enum.Enum):
        H100 = "H100"
        X_BK = "X_BK"

    consts = kernelbot_consts()
    before = (dict(consts._GPU_LOOKUP), dict(consts.GPU_TO_SM))
    with pytest.raises(ValueError, match="already has GPUs named h100"):
        register_gpus(Clashing, sm={"H100": "90a", "X_BK": None}, consts=consts)
    assert (consts._GPU_LOOKUP, consts.GPU_TO_SM) == before
