"""Find and load the flow estimator of a CosyVoice3 snapshot: `cosyvoice3.yaml` (HyperPyYAML; read with PyYAML,
its constructor tags ignored) for `flow.decoder.estimator` and `cfm_params`, and `decoder.estimator.*` of
`flow.pt`, loaded strictly into `dit.DiT`. Also the random-weight models the tests and the CLI build
(no weights are downloadable here)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rkaudio.core.errors import SetupError
from rkaudio.pipeline.checkpoint import as_repo_id, resolve_checkpoint

REPO_ID = "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
YAML_NAME = "cosyvoice3.yaml"
WEIGHTS_NAME = "flow.pt"
FILES = (YAML_NAME, WEIGHTS_NAME)  # what a snapshot directory holds
SNAPSHOT_NAME = f"{REPO_ID} snapshot"  # what a missing one is called
PREFIX = "decoder.estimator."
STRUCTURE_KEYS = ("dim", "depth", "heads", "dim_head", "ff_mult", "mel_dim", "mu_dim", "spk_dim", "out_channels",
                  "long_skip_connection")
INTEGER_KEYS = ("dim", "depth", "heads", "dim_head", "mel_dim")

# cosyvoice3.yaml `flow.decoder.estimator`: 331.1 M parameters.
REAL_CONFIG = {"dim": 1024, "depth": 22, "heads": 16, "dim_head": 64, "ff_mult": 2, "mel_dim": 80, "mu_dim": 80,
               "spk_dim": 80, "out_channels": 80}
# Every structural feature at toy width: 4 heads of 16 (RoPE rotates head 0 only), 16 conv groups, 2 blocks.
TINY_CONFIG = {"dim": 64, "depth": 2, "heads": 4, "dim_head": 16, "ff_mult": 2, "mel_dim": 80, "mu_dim": 80,
               "spk_dim": 80, "out_channels": 80}
RANDOM_CONFIGS = {"real": REAL_CONFIG, "small": TINY_CONFIG}
# cosyvoice3.yaml `flow.decoder.cfm_params`: what the ODE needs.
DEFAULT_CFM = {"t_scheduler": "cosine", "inference_cfg_rate": 0.7, "sigma_min": 1e-6}


@dataclass
class Snapshot:
    directory: Path
    config: dict  # DiT keyword arguments
    cfm: dict  # t_scheduler, inference_cfg_rate
    state_dict: dict  # decoder.estimator.* with the prefix removed


def _loader():
    import yaml

    class TagIgnoringLoader(yaml.SafeLoader):
        """Every `!tag` node is read as the plain mapping, sequence or scalar it holds."""

    def construct(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    TagIgnoringLoader.add_multi_constructor("!", construct)
    return TagIgnoringLoader


def read_yaml(path: Path) -> dict:
    import yaml

    try:
        document = yaml.load(Path(path).read_text(), Loader=_loader())  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as error:
        raise SetupError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(document, dict):
        raise SetupError(f"{path} is not a CosyVoice3 config (no top-level mapping)")
    return document


def estimator_config(document: dict, path: Path) -> tuple[dict, dict]:
    """(DiT keyword arguments, cfm params) from a parsed cosyvoice3.yaml."""
    decoder = (document.get("flow") or {}).get("decoder") if isinstance(document.get("flow"), dict) else None
    estimator = decoder.get("estimator") if isinstance(decoder, dict) else None
    if not isinstance(estimator, dict):
        raise SetupError(f"{path} has no flow.decoder.estimator mapping: expected the {REPO_ID} cosyvoice3.yaml")
    config = {key: estimator[key] for key in STRUCTURE_KEYS if key in estimator}
    for key in INTEGER_KEYS:
        if (key == "dim" or key in config) and not isinstance(config.get(key), int):
            raise SetupError(f"{path}: flow.decoder.estimator.{key} is {config.get(key)!r}, expected an integer")
    cfm = dict(DEFAULT_CFM)
    params = decoder.get("cfm_params")
    params = params.get("content", params) if isinstance(params, dict) else {}
    for key in cfm:
        if key in (params or {}):
            cfm[key] = type(DEFAULT_CFM[key])(params[key])
    if cfm["t_scheduler"] != "cosine":
        raise SetupError(f"{path}: t_scheduler {cfm['t_scheduler']!r}; the flow runtime runs the cosine schedule")
    return config, cfm


def resolve(source: str | Path) -> Path:
    """The snapshot directory holding cosyvoice3.yaml and flow.pt: `source`, a directory or a repo id looked up in
    the huggingface_hub cache (a one-line SetupError naming both when absent)."""
    return resolve_checkpoint(source, as_repo_id(source), FILES, SNAPSHOT_NAME)


def load(source: str | Path) -> Snapshot:
    import torch

    directory = resolve(source)
    config, cfm = estimator_config(read_yaml(directory / YAML_NAME), directory / YAML_NAME)
    weights_path = directory / WEIGHTS_NAME
    try:
        weights = torch.load(str(weights_path), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 (a corrupt or foreign file: say which, in one line)
        raise SetupError(f"{weights_path} is not a torch state dict ({error.__class__.__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''})") from None
    if not isinstance(weights, dict):
        raise SetupError(f"{weights_path} holds a {type(weights).__name__}, expected the flow state dict")
    state = {key[len(PREFIX):]: value for key, value in weights.items() if key.startswith(PREFIX)}
    if not state:
        raise SetupError(f"{weights_path} has no '{PREFIX}*' tensors: expected the {REPO_ID} flow weights")
    return Snapshot(directory, config, cfm, state)


def load_strict(model, state: dict, where: str) -> None:
    """Load `state` into `model` strictly; differing keys or shapes fail with one line naming them."""
    expected = model.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    if missing or unexpected:
        def names(keys):
            return ", ".join(PREFIX + key for key in keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")

        parts = ([f"missing {len(missing)} key(s): {names(missing)}"] if missing else []) + \
                ([f"unexpected {len(unexpected)} key(s): {names(unexpected)}"] if unexpected else [])
        raise SetupError(f"{where} does not match the DiT of its config: {'; '.join(parts)}")
    wrong = [(key, tuple(state[key].shape), tuple(expected[key].shape)) for key in expected
             if tuple(state[key].shape) != tuple(expected[key].shape)]
    if wrong:
        key, got, want = wrong[0]
        raise SetupError(f"{where} does not match the DiT of its config: {len(wrong)} shape mismatch(es), first "
                         f"{PREFIX}{key} is {list(got)}, the config gives {list(want)}")
    model.load_state_dict(state, strict=True)


def load_estimator(source: str | Path):
    """(the DiT with the snapshot's weights, float32, eval; the snapshot)."""
    from rkaudio.families.cosyvoice3.dit import build

    snapshot = load(source)
    model = build(snapshot.config)
    load_strict(model, {k: v.float() for k, v in snapshot.state_dict.items()}, str(snapshot.directory / WEIGHTS_NAME))
    return model, snapshot


def random_estimator(config: dict, seed: int = 0):
    """A DiT with upstream's default init from `seed` (the shapes a real flow.pt has)."""
    import torch

    from rkaudio.families.cosyvoice3.dit import build

    torch.manual_seed(seed)
    return build(config)


YAML_TEMPLATE = """# written by rkaudio (random weights): the flow section of cosyvoice3.yaml, tags as upstream writes them
chunk_size: 25
token_mel_ratio: 2
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
{estimator}            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: -1
"""


def write(directory: Path, config: dict, estimator_state: dict, extra: dict | None = None) -> Path:
    """A snapshot in the released layout: cosyvoice3.yaml (upstream's tags) + flow.pt with `decoder.estimator.*`
    (and `extra` flow keys, e.g. the token embedding a real flow.pt also holds)."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"            {key}: {value}\n" for key, value in config.items())
    (directory / YAML_NAME).write_text(YAML_TEMPLATE.format(estimator=lines))
    state = {PREFIX + key: value.contiguous() for key, value in estimator_state.items()}
    state.update(extra or {})
    torch.save(state, str(directory / WEIGHTS_NAME))
    return directory
