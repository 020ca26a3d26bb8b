"""Export every Audio8-ASR graph to a fixed-shape ONNX with its contract, plus the plan that lists them.

Graphs: encoder, one adapter for every placeholder count N (the pooling matrix is an input), one prefill
for every prompt length (S = the largest prompt, N_max + 10, right-padded; no LM head inside), one decoder step
per K/V bucket (every layer in one call: the new K/V rows out, the CPU writes them), LM head shards (the
prefill's first token too). `audio8_plan.json` lists each file with its contract and the engine it compiles to;
`embed_tokens.npy` is the fp16 table the CPU looks tokens up in (the tied LM head's rows: the NPU holds them in
fp16 too). `export` is the family's one export: the graphs, then the token gates run through them, recorded on
every graph, then the end-to-end golden of the board self-test kit (`with_end_to_end`: a probe clip, 5
tokens)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rkaudio.pipeline.attention import AttentionForms
from rkaudio.pipeline.pipeline import Exported, record_export
from rkaudio.core.paths import engine_name, selfcheck_path
from rkaudio.gates.verdict import require
from rkaudio.board.contract import EngineContract
from rkaudio.board.verdict import Verdict, at_most
from rkaudio.board.audio8 import (EMBEDS_BY_CHANNEL, EMBEDS_BY_POSITION, PLAN_FILE, Audio8AdapterFields, Audio8Fields,
                                  Audio8HeadFields, Audio8PrefillFields, Audio8StepFields, Prompt, graph_key, mel_chunks,
                                  padded_pooling, placeholder_count, rope_tables)

EMBED_FILE = "embed_tokens.npy"
# The attention form per target (rkaudio.pipeline.attention), applied to the encoder, the prefill and every step:
# the RK3566 runs Softmax and rank-4 attention layouts on its CPU, rk3588 and rk3576 keep the exported Softmax. The
# exp ratio shifts by each row's max: no constant bounds the logits (the small prefill's rows peak at -3.2 .. 28.8).
ATTENTION_FORMS = AttentionForms(forms={"rk3566": "exp_ratio"}, logit_bound=None)
OPSET = 17
E2E_NAME = "audio8_probe"
E2E_LOOP = "rkaudio.board.audio8:golden_loop"
E2E_TOKENS = 5
E2E_PLACEHOLDERS = 25  # a 2 s probe clip
# The step's CPU-held buffers (the mask, every layer's K/V) are fed in fp16, the dtype the engine holds them in, so
# rknnlite converts none of the step's largest inputs; the runtime keeps them in it from token to token. The
# board-time model predicts the rk3576 real-shape token (step + 8 head shards) at 151.2 ms, 181.0 fed in fp32
# (-16.5%; bench/results/audio8_layouts_real-shape.md). The onnxruntime path keeps fp32 buffers (its fp32 gates).
STEP_BUFFER_DTYPE = "float16"
# The board showed in-graph caches and 4-D cache layouts corrupt: no decoder graph may concatenate or scatter
# cache data. Cache data is a K/V buffer input (full_*, past_*) or a K/V output (key*, value*), followed through
# the ops that only move data; a contraction (the query's MatMul with the buffer) ends it, so a Concat of the
# step's two score vectors passes.
CACHE_OPS = ("Concat", "ScatterND", "ScatterElements", "Scatter")
MOVE_OPS = CACHE_OPS + ("Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice",
                        "Gather", "Expand", "Split", "Pad", "Tile")


def _is_cache_input(name: str) -> bool:
    return name.startswith("full_") or "past" in name


def _is_cache_output(name: str) -> bool:
    return name.startswith(("key", "value"))


def cache_free_verdict(model, name: str) -> Verdict:
    """Fails when a graph builds or updates a cache itself: a Concat/Scatter of cache data, or a past_* input."""
    nodes = model.graph.node
    forward = {i.name for i in model.graph.input if _is_cache_input(i.name)}
    for node in nodes:  # topological order: a moved buffer is still the buffer
        if node.op_type in MOVE_OPS and forward.intersection(node.input):
            forward.update(node.output)
    backward = {o.name for o in model.graph.output if _is_cache_output(o.name)}
    for node in reversed(nodes):  # what a K/V output is assembled from
        if node.op_type in MOVE_OPS and backward.intersection(node.output):
            backward.update(node.input)
    found = [f"{n.op_type}:{n.name}" for n in nodes if n.op_type in CACHE_OPS
             and (forward.intersection(n.input) or backward.intersection(n.output))]
    found += [f"input:{i.name}" for i in model.graph.input if "past" in i.name]
    return at_most(f"cache_free[{name}]", len(found), 0, "nodes", ", ".join(found[:8]))


def _export(module, args: tuple, input_names: list[str], output_names: list[str], contract: EngineContract,
            path: Path, shape=None):
    """Export `module` to `path` with its shapes pinned and `contract`; `shape(model) -> model` (the target's
    attention form) runs on the pinned graph before it is written."""
    import onnx
    import torch

    from rkaudio.surgery.graph.fold import fold_fixed
    from rkaudio.core.contract import set_contract

    raw = path.with_suffix(".raw.onnx")
    with torch.no_grad():
        torch.onnx.export(module, args, str(raw), input_names=input_names, output_names=output_names,
                          opset_version=OPSET, dynamo=False, do_constant_folding=True)
    model = fold_fixed(onnx.load(str(raw)))
    raw.unlink()
    if shape is not None:
        model = shape(model)
    model = set_contract(model, contract)
    onnx.save(model, str(path))
    return model


def export_all(job, model, seed: int = 0) -> dict:
    """Write every graph of `job` (its K/V buckets and head shards, into its `out`), its self-check inputs, the
    embedding table and the plan (no token gate: `export`)."""
    import torch

    from rkaudio.families.audio8 import graphs
    from rkaudio.core.errors import SetupError
    from rkaudio.board.golden import as_stored  # self-check inputs in the board kit's storage form

    out_dir, head_shards = Path(job.out), job.options.head_shards
    out_dir.mkdir(parents=True, exist_ok=True)
    decoder_config = model.decoder.config
    heads = decoder_config.num_attention_heads
    if decoder_config.num_key_value_heads != heads:
        raise SetupError(f"decoder has {decoder_config.num_key_value_heads} K/V heads for {heads} query heads; "
                         "the rank-3 K/V buffers [heads, Smax, head_dim] need one K/V head per query head")
    hidden, vocab = decoder_config.hidden_size, decoder_config.vocab_size
    head_dim = hidden // heads
    encoder_config = model.encoder.config
    audio_tokens = encoder_config.audio_tokens
    hop = 160
    prompt_extra = len(model.prompt.prefix_ids) + len(model.prompt.suffix_ids)
    # the longest clip the encoder takes gives the most placeholders: the adapter's rows, the prefill's S
    max_placeholders = placeholder_count(encoder_config.max_frames * hop, hop)
    prompt_length = max_placeholders + prompt_extra
    layout = graphs.LAYOUTS.get(str(job.target), graphs.Layout())
    prompt_length = -(-prompt_length // layout.prompt_multiple) * layout.prompt_multiple
    kv_buckets = sorted(job.options.kv_buckets)
    if max_placeholders > audio_tokens:
        raise SetupError(f"{max_placeholders} placeholders exceed the encoder's {audio_tokens} tokens")
    if prompt_length >= kv_buckets[-1]:
        raise SetupError(f"largest prompt ({prompt_length}) does not fit the largest K/V bucket {kv_buckets[-1]}")
    fields = dict(  # every graph's (`Audio8Fields`)
        sample_rate=16000, mel_bins=encoder_config.num_mel_bins, n_fft=400, hop=hop,
        max_frames=encoder_config.max_frames, chunk_frames=encoder_config.chunk_frames, audio_tokens=audio_tokens,
        max_placeholders=max_placeholders,
        prompt_length=prompt_length, kv_buckets=kv_buckets, head_shards=head_shards,
        layers=decoder_config.num_hidden_layers, heads=heads, head_dim=head_dim, hidden=hidden, vocab=vocab,
        rope_theta=float(decoder_config.rope_theta),
        mask_value=graphs.MASKED, kv_layout="heads,Smax,head_dim",
        prompt=Prompt(list(model.prompt.prefix_ids), model.prompt.audio_token_id, list(model.prompt.suffix_ids),
                      model.prompt.eos_token_id),
    )
    rng = np.random.default_rng(seed)
    entries, verdicts, attention_verdicts = [], [], []

    def in_target_form(stem: str, feeds: dict[str, np.ndarray], self_normalised: bool = False):
        def shape(onnx_model):
            shaped, judged = ATTENTION_FORMS.apply(onnx_model, job.target, feeds, suffix=f"[{stem}]")
            attention_verdicts.extend(judged)
            if self_normalised and ATTENTION_FORMS.form(job.target) == "exp_ratio":
                from rkaudio.surgery.graph.attention import softmax_as_row_max_exp

                shaped = softmax_as_row_max_exp(shaped)
            return shaped
        return shape

    def emit(stem: str, module, feeds: dict[str, np.ndarray], outputs: list[str], component: str, role: str,
             graph_fields: Audio8Fields, cache_free: bool = False, attention: bool = False,
             self_normalised: bool = False, **shared):
        # the board runtime reads the plan (graph roles, buckets) and the fp16 embedding table beside the engines
        contract = job.contract(role, component=component, package_files=[PLAN_FILE, EMBED_FILE], **shared,
                                **graph_fields.to_fields())
        path = out_dir / f"{stem}.onnx"
        args = tuple(torch.from_numpy(value) for value in feeds.values())
        onnx_model = _export(module, args, list(feeds), outputs, contract, path,
                             shape=in_target_form(stem, feeds, self_normalised) if attention else None)
        fed = contract.feed_dtypes or {}  # the self-check holds each input as the runtime feeds it
        np.savez(selfcheck_path(path), **{name: as_stored(value.astype(fed.get(name, value.dtype)))
                                          for name, value in feeds.items()})
        if cache_free:
            verdicts.append(cache_free_verdict(onnx_model, stem))
        entries.append({"onnx": path.name, "selfcheck": selfcheck_path(path).name, "rknn": engine_name(path),
                        "contract": contract.to_json()})

    def normal(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    features = normal(encoder_config.num_mel_bins, encoder_config.max_frames)
    emit("encoder", graphs.EncoderGraph(model.encoder, layout),
         {"mel_chunks": mel_chunks(features, encoder_config.chunk_frames)}, ["audio_hidden"], "encoder", "main",
         Audio8Fields(**fields), attention=True)
    with torch.no_grad():
        audio_hidden = model.encoder(torch.from_numpy(features)).numpy()
    example_n = (3 * max_placeholders) // 8  # the self-check feeds: a clip of about 3 s, rows past it zero
    emit("adapter", graphs.AdapterGraph(model.adapter, layout),
         {"audio_hidden": audio_hidden, "pool": padded_pooling(audio_tokens, example_n, max_placeholders)[None]},
         ["audio_embeddings"], "adapter", "main", Audio8AdapterFields(**fields, rows=max_placeholders))
    layers = decoder_config.num_hidden_layers
    cache_names = [f"{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    cos, sin = rope_tables(np.arange(prompt_length), head_dim, decoder_config.rope_theta)
    select = np.zeros((1, prompt_length), np.float32)
    select[0, example_n + prompt_extra - 1] = 1.0
    embeds = normal(1, prompt_length, hidden)
    embeds_layout = EMBEDS_BY_CHANNEL if layout.embeds_by_channel else EMBEDS_BY_POSITION
    emit("prefill", graphs.PrefillGraph(model.decoder, prompt_length, layout),
         {"inputs_embeds": embeds.transpose(0, 2, 1).copy() if layout.embeds_by_channel else embeds, "cos": cos,
          "sin": sin, "select": select},
         ["last_hidden", *cache_names], "prefill", "main",
         Audio8PrefillFields(**fields, length=prompt_length, embeds_layout=embeds_layout), cache_free=True,
         attention=True)
    cos, sin = rope_tables(np.array([7]), head_dim, decoder_config.rope_theta)
    token_hidden = normal(1, 1, hidden)
    step_inputs, step_outputs = graphs.step_input_names(layers), graphs.step_output_names(layers)
    step_feed_dtypes = {name: STEP_BUFFER_DTYPE for name in graphs.step_buffer_names(step_inputs)}
    for bucket in kv_buckets:
        mask = np.zeros((heads, 1, bucket), dtype=np.float32)
        mask[:, :, 7:] = graphs.MASKED  # rows 0..6 written, this token's row 7 still masked
        caches = [normal(heads, bucket, head_dim) for _ in range(2 * layers)]
        emit(f"step_s{bucket}", graphs.StepGraph(model.decoder, layout=layout),
             dict(zip(step_inputs, [token_hidden, cos, sin, mask, *caches])), step_outputs, "decoder",
             f"step_{bucket}", Audio8StepFields(**fields, bucket=bucket), cache_free=True,
             feed_dtypes=step_feed_dtypes, attention=True, self_normalised=layout.step_row_sum)
    for shard, (start, stop) in enumerate(graphs.shard_ranges(vocab, head_shards)):
        head = graphs.HeadShardGraph(model.decoder, start, stop, rank3=layout.rank3_head)
        emit(f"head_{shard}", head, {"hidden": token_hidden},
             ["logits"], "decoder", "head", Audio8HeadFields(**fields, shard=shard, rows=[start, stop]),
             cache_free=True, ladder_key=shard)
    # fp16 halves the table (Audio8-ASR-0.1B: 311 MB fp32); the runtime widens the rows it reads to fp32
    table = model.decoder.get_input_embeddings().weight.detach().numpy().astype(np.float16)
    np.save(out_dir / EMBED_FILE, table)
    plan = {"family": job.family.contract_name, "embed_table": EMBED_FILE, "graphs": entries,
            "verdicts": [v.to_json() for v in verdicts],
            "attention_verdicts": [v.to_json() for v in attention_verdicts]}
    _write_plan(out_dir, plan)
    require(verdicts, advice="keep the K/V cache outside the graph: rank-3 buffers the CPU writes in place",
            context="audio8 export")
    return plan


def _write_plan(out_dir: Path, plan: dict) -> None:
    (Path(out_dir) / PLAN_FILE).write_text(json.dumps(plan, indent=1))


def name_built_engines(out_dir: Path, engines: list[tuple[str, EngineContract]]) -> None:
    """Point each graph of the plan at the engine built for it: `engines` are (file name, contract) of the build.
    An engine compiled for several shape sets (`--ladder dynamic`: the step buckets) runs the graph of each of its
    sets, whose own fixed-shape engine was never built; the board runtime opens its engines by the plan."""
    plan_path = Path(out_dir) / PLAN_FILE
    if not plan_path.is_file():  # `--onnx` of one graph into another directory: no plan there to point
        return
    built = {graph_key(view): name for name, contract in engines for view in contract.views()}
    plan = json.loads(plan_path.read_text())
    for entry in plan["graphs"]:
        entry["rknn"] = built.get(graph_key(EngineContract.from_json(entry["contract"])), entry["rknn"])
    _write_plan(out_dir, plan)


def export(job, model, stress: bool = True, say=print, clips=None) -> list[Exported]:
    """Export every graph of `job`, warn of problem ops (for its target), run the token gates through the graphs
    and record their verdicts on each one: one `Exported` per graph, all sharing the verdicts (`pipeline.build`
    gates them once). `clips`: the probe clip lengths in seconds the token gates decode (default
    `checks.PROBE_SECONDS`)."""
    from rkaudio.families.audio8.checks import graph_verdicts
    from rkaudio.gates.verdict import refuse_degenerate
    from rkaudio.core.contract import contract_of
    from rkaudio.gates import opscan

    out_dir = Path(job.out)
    plan = export_all(job, model)
    say(f"exported {len(plan['graphs'])} graphs to {out_dir}")
    for entry in plan["graphs"]:
        problems = opscan.scan(out_dir / entry["onnx"], job.target)
        if problems:
            say(f"{entry['onnx']}:")
            opscan.warn(problems)
    verdicts = refuse_degenerate(graph_verdicts(model, out_dir, stress=stress, say=say, clips=clips), "audio8 export")
    verdicts += [Verdict.from_json(v) for v in plan["attention_verdicts"]]  # the logit bound of the target's form
    records = [record_export(out_dir / entry["onnx"], verdicts) for entry in plan["graphs"]]
    # the plan carries each graph's contract as the graph does, export verdicts included
    for entry in plan["graphs"]:
        entry["contract"] = contract_of(out_dir / entry["onnx"]).to_json()
    _write_plan(out_dir, plan)
    return with_end_to_end(records, out_dir, say=say)


def with_end_to_end(records: list[Exported], out_dir: Path, tokens: int = E2E_TOKENS, say=print) -> list[Exported]:
    """Declare the family's end-to-end golden on `records`: the 2 s probe clip (25 placeholders) through
    the runtime loop (`rkaudio.board.audio8:golden_loop`), exactly `tokens` tokens with EOS ignored. The probe is
    first run here through the plan on onnxruntime (the existing path): the graphs it opens are the golden's
    engines, the embedding rows it reads (prompt ids, fed-back tokens) are an input beside the clip, and
    `tie_margin` is the family's margin gate threshold (`checks.fp16_resolution`) at the largest top-1 logit
    of its steps. Returns `records`, those the golden runs naming it."""
    from rkaudio.pipeline import pipeline
    from rkaudio.families.audio8.checks import fp16_resolution, probe_audio
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.golden import as_stored
    from rkaudio.board.audio8 import Audio8Runtime
    from rkaudio.board.mel import log_mel

    out_dir = Path(out_dir)
    opened = []

    def backend_for(path: Path):
        opened.append(path.name)
        return OnnxBackend(path)

    with Audio8Runtime(out_dir, backend_for=backend_for) as runtime:
        fields = runtime.fields
        placeholders = E2E_PLACEHOLDERS
        audio = as_stored(probe_audio(placeholders, fields.hop))  # the clip as the kit stores it
        decoded = runtime.transcribe(log_mel(audio, fields.mel_bins), audio.size, tokens, ignore_eos=True,
                                     keep_logits=True)
        ids = np.array(sorted(set(runtime.prompt_ids(placeholders)) | set(decoded.tokens[:-1])), dtype=np.int64)
    table = np.load(out_dir / EMBED_FILE, mmap_mode="r")
    inputs = {"audio": audio, "embed_ids": ids, "embed_rows": np.asarray(table[ids], dtype=np.float32)}
    params = {"tokens": tokens, "tie_margin": max(fp16_resolution(np.max(logits)) for logits in decoded.step_logits)}
    golden = [record for record in records if record.onnx.name in opened]
    declared = pipeline.record_end_to_end(
        E2E_NAME, E2E_LOOP, golden, inputs, params,
        f"the probe clip ({audio.size / fields.sample_rate:g} s, chirp in noise, {placeholders} placeholders) "
        f"-> {tokens} greedy tokens, EOS ignored, K/V buckets {' -> '.join(map(str, decoded.buckets))}")
    say(f"end-to-end golden {E2E_NAME}: {len(golden)} of {len(records)} graphs, {tokens} tokens, "
        f"tie margin {params['tie_margin']:.4g}")
    by_onnx = {record.onnx: record for record in declared}
    return [by_onnx.get(record.onnx, record) for record in records]
