"""custom_string is embedded in the .rknn, so it is part of every engine's bytes and of its `normalized_sha256`
(the digest release_diff compares across commits): reading the contract through EngineContract must give it exactly
the string it had when the contract was a dict.

The expected strings are pinned: they were computed by the dict-reading custom_string of commit 4bf32ea (before
the typed contract) on the same JSON, and hard-coded here. Do not regenerate them from today's code: a change here is
a change of every engine built, and must be one on purpose."""
from __future__ import annotations

import json

from rkaudio.board.contract import EngineContract
from rkaudio.toolkit.session import custom_string

PRODUCER = {"command": "convert kokoro --target rk3588", "git": "0123456789abcdef0123456789abcdef01234567",
            "rkaudio": "0.1.0"}
# Every field custom_string reads: exec_params with a nested dict, and a dynamic ladder's shape sets whose first
# varying input ("F0") sorts first only in the loaded (sorted) order, with a role per set.
LADDER = {"family": "kokoro", "component": "generator", "role": "main", "exec_plan_option": "kokoro_tts.exec_plan",
          "producer": PRODUCER, "ladder_key": 128, "ladder": "dynamic", "window": 128, "context": 8,
          "exec_params": {"window_frames": 128, "context_frames": 8, "style": {"voice": "af", "speed": 1.0}},
          "shape_sets": [
              {"inputs": {"asr": [1, 512, 64], "F0": [1, 128]}, "outputs": {"audio": [1, 19200]},
               "contract": {"ladder_key": 64, "role": "first", "window": 64}},
              {"inputs": {"asr": [1, 512, 128], "F0": [1, 256]}, "outputs": {"audio": [1, 38400]},
               "contract": {"ladder_key": 128, "role": "main", "window": 128}}]}
PINNED = ('{"family":"kokoro","component":"generator","role":"main","exec_plan_option":"kokoro_tts.exec_plan",'
          '"rkaudio":"0.1.0","git":"0123456789abcdef0123456789abcdef01234567","ladder_key":128,'
          '"exec_params":{"context_frames":8,"style":{"speed":1.0,"voice":"af"},"window_frames":128},'
          '"shape_sets":{"by":"F0","sets":[["first",[1,128]],["main",[1,256]]]}}')
# exec_params past the 1024-byte limit: skipped, and the shape sets after it still fit.
PINNED_WITHOUT_PARAMS = ('{"family":"kokoro","component":"generator","role":"main",'
                         '"exec_plan_option":"kokoro_tts.exec_plan","rkaudio":"0.1.0",'
                         '"git":"0123456789abcdef0123456789abcdef01234567","ladder_key":128,'
                         '"shape_sets":{"by":"F0","sets":[["first",[1,128]],["main",[1,256]]]}}')


def loaded(data: dict) -> EngineContract:
    """The contract as the build reads it back from the ONNX metadata (stored with sorted keys)."""
    return EngineContract.from_json(json.loads(json.dumps(data, sort_keys=True)))


def test_custom_string_is_the_one_engines_were_built_with():
    assert custom_string(loaded(LADDER)) == PINNED
    assert custom_string(loaded({**LADDER, "exec_params": {"table": list(range(400))}})) == PINNED_WITHOUT_PARAMS
