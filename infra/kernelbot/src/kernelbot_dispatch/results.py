"""kernelbot's result dataclasses, and building them from the JSON the service sends.

Inside kernelbot the real classes from ``libkernelbot.run_eval`` are used, so what the
launcher returns is exactly what kernelbot's reports and database expect. Elsewhere (tests,
tools) local mirrors with the same fields and defaults stand in.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
from collections.abc import Mapping
from typing import Any

try:
    from libkernelbot.run_eval import (
        CompileResult,
        EvalResult,
        FullResult,
        ProfileResult,
        RunResult,
        SystemInfo,
    )

    FROM_KERNELBOT = True
except ImportError:  # not running inside kernelbot
    FROM_KERNELBOT = False

    @dataclasses.dataclass
    class ProfileResult:  # type: ignore[no-redef]
        profiler: str
        trace: str
        download_url: str | None

    @dataclasses.dataclass
    class CompileResult:  # type: ignore[no-redef]
        nvcc_found: bool
        nvcc_version: str
        success: bool
        command: str
        stdout: str
        stderr: str
        exit_code: int

    @dataclasses.dataclass
    class RunResult:  # type: ignore[no-redef]
        success: bool
        passed: bool
        command: str
        stdout: str
        stderr: str
        exit_code: int
        duration: float
        result: dict[str, Any]

    @dataclasses.dataclass
    class SystemInfo:  # type: ignore[no-redef]
        gpu: str = ""
        device_count: int = 1
        cpu: str = ""
        runtime: str = ""
        platform: str = ""
        torch: str = ""
        hostname: str = ""

    @dataclasses.dataclass
    class EvalResult:  # type: ignore[no-redef]
        start: datetime.datetime
        end: datetime.datetime
        compilation: CompileResult | None
        run: RunResult | None
        profile: ProfileResult | None

    @dataclasses.dataclass
    class FullResult:  # type: ignore[no-redef]
        success: bool
        error: str
        system: SystemInfo
        runs: dict[str, EvalResult] = dataclasses.field(default_factory=dict)


__all__ = [
    "FROM_KERNELBOT",
    "CompileResult",
    "EvalResult",
    "FullResult",
    "ProfileResult",
    "RunResult",
    "SystemInfo",
    "failed_result",
    "full_result_from_json",
    "full_result_to_json",
]

_ZERO: dict[Any, Any] = {bool: False, int: 0, float: 0.0, str: ""}


def _zero(annotation: Any) -> Any:
    """A value for a required field the JSON lacks: None where allowed, else an empty one."""
    args = typing.get_args(annotation)
    if type(None) in args:
        return None
    origin = typing.get_origin(annotation) or annotation
    if origin in (dict, list):
        return origin()
    return _ZERO.get(origin)


def _build(cls: type, data: Any, **nested: Any) -> Any:
    """``cls`` from a JSON object: unknown keys dropped, missing ones defaulted.

    ``nested`` maps a field name to a function converting that field's JSON value (None
    when a required one is missing).
    Field lists are read from the class itself, so kernelbot versions that add or drop a
    field still work.
    """
    if not isinstance(data, Mapping):
        data = {}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name in data:
            value = data[field.name]
            convert = nested.get(field.name)
            kwargs[field.name] = convert(value) if convert else value
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            convert = nested.get(field.name)
            kwargs[field.name] = convert(None) if convert else _zero(hints.get(field.name))
    return cls(**kwargs)


def _optional(cls: type) -> Any:
    return lambda value: None if value is None else _build(cls, value)


def _timestamp(value: Any) -> datetime.datetime | None:
    """kernelbot writes ``datetime.isoformat()``; anything unreadable becomes None."""
    if isinstance(value, datetime.datetime):
        return value
    try:
        return datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None


def _profile(value: Any) -> Any:
    """kernelbot's ``ProfileResult``. The service leaves the profiler's files as a download
    (``trace: null``, ``download_url`` its link); kernelbot's report shows a profile's
    tables and link only when ``trace`` is a string, and ``""`` is its own convention for
    "the files are at ``download_url``"."""
    if not isinstance(value, Mapping):
        return None
    return _build(ProfileResult, {**value, "trace": value.get("trace") or ""})


def _eval_result(value: Any) -> Any:
    return _build(
        EvalResult,
        value,
        start=_timestamp,
        end=_timestamp,
        compilation=_optional(CompileResult),
        run=_optional(RunResult),
        profile=_profile,
    )


def _runs(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {}
    return {str(name): _eval_result(run) for name, run in value.items()}


def full_result_from_json(data: Mapping[str, Any]) -> Any:
    """kernelbot's ``FullResult`` (with nested dataclasses) from its JSON form."""
    return _build(FullResult, data, system=lambda v: _build(SystemInfo, v), runs=_runs)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def full_result_to_json(result: Any) -> dict[str, Any]:
    """The JSON form of a ``FullResult``, as kernelbot's runners write ``result.json``."""
    return {k: _plain(v) for k, v in dataclasses.asdict(result).items()}


def failed_result(error: str) -> Any:
    """A ``FullResult`` for a run that produced no result; kernelbot shows ``error``."""
    return FullResult(success=False, error=error, system=SystemInfo(), runs={})
