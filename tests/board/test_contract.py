"""The typed engine contract reads back exactly the JSON it was made from (null fields, float ladder keys, shape
sets, a foreign ONNX's empty contract), splits shared from family fields, and a family's typed fields refuse a
contract that lacks one of them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pytest

from rkaudio.board.contract import ContractFields, EngineContract

PRODUCER = {"command": "convert piper", "git": "0" * 40, "rkaudio": "0.1.0"}
# A Piper decoder's contract as published manifests hold it: cond_input/cond_channels/polyphase present as null.
PIPER = {"component": "decoder", "cond_channels": None, "cond_input": None, "context": 32, "dec_mask": False,
         "emitted": 237, "exec_plan_option": "piper_tts.exec_plan", "family": "piper", "hop": 256,
         "latent_input": "z", "output": "audio", "polyphase": None, "producer": PRODUCER, "role": "main",
         "strides": [8, 8, 2, 2], "window": 301}
# A CosyVoice3 part: its ladder key is the length plus part/100, a float that must stay a float.
COSYVOICE3_PART = {"component": "flow", "exec_plan_option": "cosyvoice3.exec_plan", "family": "cosyvoice3",
                   "ladder_key": 110.01, "length": 110, "package_files": ["cosyvoice3_chain.json"], "role": "main"}
# A dynamic ladder: one engine, its shape sets each with the fields that differ.
LADDER = {"component": "conv", "exec_plan_option": "example.exec_plan", "family": "example", "ladder": "dynamic",
          "role": "main", "channels": 16,
          "shape_sets": [{"inputs": {"x": [1, 16, 64]}, "outputs": {"y": [1, 16, 64]},
                          "contract": {"frames": 64, "ladder_key": 64, "role": "main"}},
                         {"inputs": {"x": [1, 16, 128]}, "outputs": {"y": [1, 16, 128]},
                          "contract": {"frames": 128, "ladder_key": 128, "role": "main"}}]}


@pytest.mark.parametrize("data", [PIPER, COSYVOICE3_PART, LADDER, {}], ids=["piper", "cosyvoice3", "ladder", "foreign"])
def test_the_json_reads_back_exactly(data):
    contract = EngineContract.from_json(data)
    assert json.dumps(contract.to_json(), sort_keys=True) == json.dumps(data, sort_keys=True)
    assert list(contract.to_json()) == sorted(data)  # the manifest stores the contract sorted, as ONNX metadata does


def test_shared_and_family_fields_are_apart():
    contract = EngineContract.from_json(COSYVOICE3_PART)
    assert (contract.family, contract.role, contract.ladder_key, contract.package_files) == \
        ("cosyvoice3", "main", 110.01, ["cosyvoice3_chain.json"])
    assert isinstance(contract.ladder_key, float)
    assert dict(contract.fields) == {"length": 110}
    assert EngineContract.from_json({}).empty and not contract.empty


def test_a_family_field_cannot_pose_as_a_shared_one():
    with pytest.raises(ValueError, match="ladder_key"):
        EngineContract.from_json(PIPER).with_fields(ladder_key=3).to_json()


def test_each_shape_set_is_a_view_with_its_own_fields():
    views = EngineContract.from_json(LADDER).views()
    assert [(v.shape_set, v.ladder_key, v.fields["frames"]) for v in views] == [(0, 64, 64), (1, 128, 128)]
    fixed = EngineContract.from_json(PIPER)
    assert fixed.views() == [fixed]


@dataclass(frozen=True)
class Decoder(ContractFields):
    window: int
    hop: int
    cond_input: Optional[str] = None
    voice: Optional[str] = None


def test_family_fields_read_typed_and_refuse_a_missing_one():
    fields = Decoder.of(EngineContract.from_json({**PIPER, "window": 301.0}))
    assert (fields.window, fields.hop, fields.cond_input, fields.voice) == (301, 256, None, None)
    assert isinstance(fields.window, int)
    assert Decoder.of(EngineContract.from_json(PIPER), hop=512).hop == 512
    with pytest.raises(ValueError, match="'hop'"):
        Decoder.of(EngineContract.from_json({"window": 301}))
    assert fields.to_fields() == {"window": 301, "hop": 256, "cond_input": None, "voice": None}
