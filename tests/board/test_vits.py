"""The VITS window kind (rkaudio.board.vits) and its Piper and Inflect fields: a published contract reads back into
them and writes out unchanged (its null fields present as null), and one exported before a field existed reads it at
its default."""
from __future__ import annotations

import pytest

from rkaudio.board.contract import EngineContract
from rkaudio.board.inflect import InflectWindow
from rkaudio.board.piper import PiperWindow
from rkaudio.board.vits import VitsWindow

IDENTITY = ("family", "component", "role", "exec_plan_option")
# The family fields of published contracts: piper_joe_medium_rk3566's decoder manifest, and `convert inflect --target
# rk3566 --window 127 --stride-phase-levels 2` of the Nano-shaped model.
PIPER = {"family": "piper", "component": "decoder", "role": "main", "exec_plan_option": "piper_tts.exec_plan",
         "cond_channels": None, "cond_input": None, "context": 32, "dec_mask": False, "emitted": 63, "hop": 256,
         "latent_channels": 192, "latent_input": "z", "mask_input": "y_mask", "output": "output", "polyphase": 4,
         "sample_rate": 22050, "stride_phase_levels": 0, "strides": [8, 8, 4], "voice": "en_US-joe-medium",
         "window": 127}
INFLECT = {"family": "inflect", "component": "decoder", "role": "main", "exec_plan_option": "inflect_v2.exec_plan",
           "context": 32, "dec_mask": True, "emitted": 63, "hop": 256, "latent_channels": 128, "latent_input": "z",
           "mask_input": "y_mask", "nodes_after_fold": 510, "nodes_before_fold": 836, "output": "waveform",
           "polyphase": 4, "sample_rate": 24000, "stride_phase_levels": 2, "strides": [8, 8, 2, 2], "window": 127}


@pytest.mark.parametrize("fields, published", [(PiperWindow, PIPER), (InflectWindow, INFLECT)])
def test_a_published_contract_reads_and_writes_back_unchanged(fields, published):
    contract = EngineContract.from_json(published)
    window = fields.of(contract)
    assert isinstance(window, VitsWindow) and window.emitted == window.window - 2 * window.context
    assert {**{key: published[key] for key in IDENTITY}, **window.to_fields()} == published


def test_null_fields_stay_present_and_old_contracts_read_at_the_defaults():
    window = PiperWindow.of(EngineContract.from_json({**PIPER, "polyphase": None}))
    assert window.polyphase is None and window.to_fields()["polyphase"] is None
    assert {"polyphase", "cond_input", "cond_channels"} <= set(window.to_fields())
    older = {key: value for key, value in PIPER.items() if key not in ("stride_phase_levels", "polyphase")}
    window = PiperWindow.of(EngineContract.from_json(older))
    assert (window.stride_phase_levels, window.polyphase) == (0, None)


def test_a_family_window_extends_the_vits_window_it_was_made_with():
    vits = VitsWindow.two_sided(127, 32, hop=256, latent_input="z", output="waveform", mask_input="y_mask",
                                latent_channels=128, sample_rate=24000, dec_mask=True, strides=[8, 8, 2, 2],
                                polyphase=4, stride_phase_levels=2)
    window = InflectWindow.extended(vits, nodes_before_fold=836, nodes_after_fold=510)
    assert {**{key: INFLECT[key] for key in IDENTITY}, **window.to_fields()} == INFLECT
