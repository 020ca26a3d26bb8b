"""The real loading path (`from_pretrained(snapshot, trust_remote_code=True)`) on a small snapshot this test
writes: remote code in the snapshot, random weights, no network."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import torch

MODELING = textwrap.dedent('''
    from transformers import PretrainedConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

    from rkaudio.families.audio8.model import Adapter, AdapterConfig, AudioEncoder, EncoderConfig


    class ArkasrConfig(PretrainedConfig):
        model_type = "arkasr"

        def __init__(self, encoder=None, adapter=None, decoder=None, audio_token_id=5, **kwargs):
            self.encoder, self.adapter, self.decoder = encoder or {}, adapter or {}, decoder or {}
            self.audio_token_id = audio_token_id
            super().__init__(**kwargs)


    class ArkasrForConditionalGeneration(PreTrainedModel):
        config_class = ArkasrConfig

        def __init__(self, config):
            super().__init__(config)
            self.encoder = AudioEncoder(EncoderConfig(**config.encoder))
            self.adapter = Adapter(AdapterConfig(**config.adapter))
            self.decoder = Qwen2ForCausalLM(Qwen2Config(**config.decoder))
''')


def test_load_snapshot_with_remote_code(tmp_path, monkeypatch, small_model):
    from dataclasses import asdict

    import transformers.dynamic_module_utils as dynamic

    from rkaudio.families.audio8 import model as M

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    source = tmp_path / "source"
    source.mkdir()
    (source / "modeling_arkasr.py").write_text(MODELING)
    monkeypatch.syspath_prepend(str(source))
    import modeling_arkasr

    config = M.small_config()
    modeling_arkasr.ArkasrConfig.register_for_auto_class()
    modeling_arkasr.ArkasrForConditionalGeneration.register_for_auto_class("AutoModel")
    arkasr_config = modeling_arkasr.ArkasrConfig(
        encoder=asdict(config.encoder), adapter=asdict(config.adapter), decoder=small_model.decoder.config.to_dict(),
        audio_token_id=config.prompt.audio_token_id, eos_token_id=config.prompt.eos_token_id)
    upstream = modeling_arkasr.ArkasrForConditionalGeneration(arkasr_config)
    upstream.encoder.load_state_dict(small_model.encoder.state_dict())
    upstream.adapter.load_state_dict(small_model.adapter.state_dict())
    upstream.decoder.load_state_dict(small_model.decoder.state_dict())
    snapshot = tmp_path / "snapshot"
    upstream.save_pretrained(snapshot)
    sys.modules.pop("modeling_arkasr")

    loaded = M.load_snapshot(snapshot)
    features = torch.from_numpy(np.random.default_rng(0).standard_normal((128, 800)).astype(np.float32))
    assert any(name.startswith("transformers_modules") for name in sys.modules)  # the snapshot's own code ran
    assert (loaded.prompt.eos_token_id, loaded.prompt.audio_token_id) == (config.prompt.eos_token_id,
                                                                          config.prompt.audio_token_id)
    loaded.prompt = small_model.prompt  # the template ids around the audio are the real tokenizer's
    np.testing.assert_array_equal(loaded.prompt_embeddings(features, 25).numpy(),
                                  small_model.prompt_embeddings(features, 25).numpy())
