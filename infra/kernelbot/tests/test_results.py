"""Building kernelbot's FullResult from the JSON the service sends."""

from __future__ import annotations

import copy
import dataclasses
import datetime

from dispatch_helpers import FULL_RESULT

from kernelbot_dispatch.results import (
    CompileResult,
    EvalResult,
    FullResult,
    ProfileResult,
    RunResult,
    SystemInfo,
    full_result_from_json,
    full_result_to_json,
)


def test_a_realistic_result_round_trips_through_the_dataclasses() -> None:
    result = full_result_from_json(FULL_RESULT)
    assert isinstance(result, FullResult) and isinstance(result.system, SystemInfo)
    test, board = result.runs["test"], result.runs["leaderboard"]
    assert isinstance(test, EvalResult) and isinstance(test.run, RunResult)
    assert test.compilation is None and test.profile is None
    assert isinstance(board.compilation, CompileResult) and isinstance(board.profile, ProfileResult)
    assert test.start == datetime.datetime(2026, 7, 16, 10, 0, 1, 123456)
    assert test.run.passed and test.run.result["test.1.status"] == "pass"
    assert result.system.hostname == "gpu-node-3"
    assert full_result_to_json(result) == FULL_RESULT


def test_unknown_keys_are_dropped_and_missing_ones_take_defaults() -> None:
    data = copy.deepcopy(FULL_RESULT)
    data["sandbox"] = {"left_behind": 0}
    data["system"]["future_field"] = "x"
    del data["system"]["hostname"], data["system"]["device_count"]
    data["runs"]["test"]["run"]["new_metric"] = 1.0
    del data["runs"]["test"]["run"]["stderr"], data["runs"]["test"]["end"]
    del data["runs"]["leaderboard"]["profile"]["trace"]
    result = full_result_from_json(data)
    assert result.system.device_count == 1 and result.system.hostname == ""
    run = result.runs["test"].run
    assert run.stderr == "" and not hasattr(run, "new_metric")
    assert result.runs["test"].end is None
    assert result.runs["leaderboard"].profile.trace == ""
    assert result.runs["leaderboard"].profile.download_url is None


def test_an_empty_object_is_a_failed_result_with_no_runs() -> None:
    result = full_result_from_json({})
    assert (result.success, result.error, result.runs) == (False, "", {})
    assert dataclasses.asdict(result.system) == dataclasses.asdict(SystemInfo())


def test_a_profile_run_s_download_becomes_kernelbots_trace_convention() -> None:
    data = copy.deepcopy(FULL_RESULT)
    link = "https://submit.example/submissions/kb-1/profiles/0?expires=1&signature=ab"
    data["runs"]["profile.0"] = {
        "run": data["runs"]["test"]["run"],
        "profile": {"profiler": "Nsight-Compute", "trace": None, "download_url": link},
    }
    profile = full_result_from_json(data).runs["profile.0"].profile
    # kernelbot's report shows a profile's tables and link only when trace is a string.
    assert (profile.profiler, profile.trace, profile.download_url) == ("Nsight-Compute", "", link)
    data["runs"]["profile.0"]["profile"] = None
    assert full_result_from_json(data).runs["profile.0"].profile is None
