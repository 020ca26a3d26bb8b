"""`convert audio8` made from the declaration: its options refused in one line each before any model is built
(--kv-buckets a comma list of positive integers, --random-weights real|small, one source), --no-stress a
command-only switch, and a recipe that names only declared keys."""
from __future__ import annotations

import pytest

from rkaudio.families.audio8 import FAMILY
from rkaudio.core.errors import SetupError


@pytest.fixture
def calls(monkeypatch):
    """What the export was asked for (the model and the graphs replaced)."""
    import rkaudio.families.audio8 as family
    from rkaudio.families.audio8 import export

    seen = {}
    monkeypatch.setattr(family, "load_model", lambda model_dir, random_weights:
                        seen.setdefault("model", (model_dir, random_weights)))
    monkeypatch.setattr(export, "export", lambda job, model, stress: seen.update(
        buckets=job.options.kv_buckets, shards=job.options.head_shards, stress=stress, target=job.target) or [])
    return seen


def test_the_command_passes_its_options_to_the_export(calls, tmp_path, family_cli):
    result = family_cli(FAMILY, "--random-weights", "small", "--kv-buckets", "512, 128,256,128", "--head-shards", "2",
                    "--no-stress", "--target", "RK3576", "--skip-rknn", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert calls == {"model": (None, "small"), "buckets": [128, 256, 512], "shards": 2, "stress": False,
                     "target": "rk3576"}


@pytest.mark.parametrize("args, message", [
    (("--random-weights", "small", "--kv-buckets", "0,128"), "--kv-buckets: value error, needs positive integers"),
    (("--random-weights", "small", "--kv-buckets", "128;256"), "--kv-buckets '128;256': expected comma-separated"),
    (("--random-weights", "small", "--head-shards", "0"), "--head-shards: input should be greater than or equal to 1"),
    (("--random-weights", "large",), "--random-weights: input should be 'real' or 'small'"),
    ((), "give --model-dir (a local snapshot of Edge0/Audio8-ASR-0.1B) or --random-weights real|small"),
])
def test_bad_options_are_refused_before_anything_is_exported(args, message, tmp_path, monkeypatch, family_cli):
    from rkaudio.families.audio8 import export

    monkeypatch.setattr(export, "export", lambda *a, **k: pytest.fail("exported"))
    result = family_cli(FAMILY, *args, "--skip-rknn", "--out", str(tmp_path))
    assert isinstance(result.exception, SetupError) and message in str(result.exception), repr(result.exception)


def test_a_recipe_names_only_declared_keys():
    from rkaudio.pipeline.schema import check_family_tables

    recipe = {"source": {"model_dir": "/x", "dir": "/y"}, "options": {"no_stress": True, "kv_bucket": [128]},
              "gates": {}, "components": {}, "targets": ["rk3588"]}
    with pytest.raises(SetupError) as refused:
        check_family_tables(recipe, FAMILY, "recipes/a.toml")
    assert str(refused.value).splitlines() == [
        "recipes/a.toml: source.model_dir: unknown; did you mean dir?",
        "recipes/a.toml: options.no_stress: unknown; valid: kv_buckets, head_shards, ladder",
        "recipes/a.toml: options.kv_bucket: unknown; did you mean kv_buckets?"]
