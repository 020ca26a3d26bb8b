"""Greedy ASR decoding over CPU-owned rank-3 K/V buckets, on any backend with `run(feeds) -> outputs`.

The plan (`audio8_plan.json`, written by the exporter) lists every graph with its contract and the engine
it compiles to; nothing here restates a shape. One adapter serves every clip length: the runtime computes the
adaptive-average-pooling matrix for the clip's placeholder count N (`pooling_matrix`, numpy), zero-padded to
the adapter's [max_placeholders, audio_tokens] input, and keeps the first N rows the adapter returns. One
prefill serves every prompt length L: the prompt is right-padded to the prefill's S (exact on the real
positions of a causal decoder), a one-hot [1, S] selector picks the last real position's hidden state, the
runtime keeps the first L rows of every layer's K/V, and the head shards give the first token's logits, as
they do each decode step's. Per token: one call of the current bucket's step graph runs every layer over the
layers' [heads, Smax, head_dim] buffers (this position not yet written, still masked) and returns each layer's
K/V row for this position, which the CPU then writes in place and unmasks; the head shards give the logits.
When the write position reaches the bucket's end, every layer's valid rows are copied into the next bucket and
decoding continues at the same token and RoPE position; one engine compiled for every bucket's shapes (`--ladder
dynamic`: the plan names it for each step graph, a kit gives one view per bucket) stays open through it. The K/V
buffers and the mask are held in the dtype the step graph takes them in (its backend's `input_dtypes`): fp16 for
an engine whose contract feeds them in fp16 (`feed_dtypes`, the dtype the engine holds them in, so rknnlite
converts nothing), fp32 for the ONNX on onnxruntime (the fp32 path the export gates judge at fp32's floor). The
embedding table is stored in fp16 and widened to fp32 row by row. Graphs load on first use; the frontend graphs are
released after prefill.

`golden_loop` is the family's end-to-end golden for the board self-test kit: the same runtime over the kit's
engines (`rkaudio.board.golden.Engine`, each known by its contract) instead of a plan directory."""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Mapping

import numpy as np

from rkaudio.board.contract import ContractFields, EngineContract
from rkaudio.board.errors import SetupError
from rkaudio.board.mel import log_mel

PLAN_FILE = "audio8_plan.json"


class BucketError(SetupError):
    """The input does not fit the exported graphs (audio too long or empty, K/V positions exhausted)."""


@dataclass(frozen=True)
class Prompt:
    """The chat template around the audio placeholders, as token ids."""

    prefix_ids: List[int]  # the template's tokens before the audio
    audio_token_id: int  # the placeholder token: one per audio embedding row
    suffix_ids: List[int]  # the template's tokens after the audio (the assistant's turn opened)
    eos_token_id: int  # the token that ends a transcript

    def ids(self, placeholders: int) -> List[int]:
        """The prompt's token ids with `placeholders` audio placeholders."""
        return [*self.prefix_ids, *[self.audio_token_id] * placeholders, *self.suffix_ids]


@dataclass(frozen=True)
class Audio8Fields(ContractFields):
    """The fields every Audio8 graph's contract carries: the frontend, the encoder and adapter sizes, the prompt,
    the decoder's shapes and its K/V buckets (the runtime reads them off any one graph)."""

    sample_rate: int  # audio samples per second the frontend takes
    mel_bins: int  # log-mel bins per frame
    n_fft: int  # the mel frontend's STFT window, in samples
    hop: int  # samples between mel frames (the frontend's STFT hop, not a decoder window's)
    max_frames: int  # mel frames the encoder takes (a shorter clip zero-padded to them)
    chunk_frames: int  # mel frames per encoder chunk (each its own convolution image)
    audio_tokens: int  # tokens the encoder gives for max_frames, which the adapter pools
    max_placeholders: int  # audio placeholders of the longest clip: the adapter's rows
    prompt_length: int  # positions of the longest prompt: the prefill's S
    kv_buckets: List[int]  # K/V buffer lengths Smax, one decoder step graph each, ascending
    head_shards: int  # LM head graphs, the vocabulary's rows split evenly
    layers: int  # decoder layers
    heads: int  # attention heads (one K/V head each)
    head_dim: int  # channels per head
    hidden: int  # the decoder's hidden size
    vocab: int  # vocabulary size (the LM head's rows)
    rope_theta: float  # the rotary embedding's base
    mask_value: float  # the additive mask of a K/V row not yet written
    kv_layout: str  # the K/V buffers' axes ("heads,Smax,head_dim")
    prompt: Prompt  # the chat template's token ids

    def __post_init__(self):
        if isinstance(self.prompt, Mapping):  # read from the contract's JSON object
            object.__setattr__(self, "prompt", Prompt(**self.prompt))

    def to_fields(self) -> dict:
        """Every field, the prompt as its JSON object."""
        return {**super().to_fields(), "prompt": dataclasses.asdict(self.prompt)}


@dataclass(frozen=True)
class Audio8AdapterFields(Audio8Fields):
    rows: int  # the audio embedding rows the adapter returns (max_placeholders; those past a clip's N pool nothing)


# The prefill's inputs_embeds axes (`Audio8PrefillFields.embeds_layout`).
EMBEDS_BY_POSITION, EMBEDS_BY_CHANNEL = "S,hidden", "hidden,S"


@dataclass(frozen=True)
class Audio8PrefillFields(Audio8Fields):
    length: int  # the positions the prefill runs (prompt_length; a shorter prompt right-padded)
    # the axes of its inputs_embeds: EMBEDS_BY_POSITION [1, S, hidden], or EMBEDS_BY_CHANNEL [1, hidden, S] (the
    # RK3566 layout: fed channel-first, that compiler keeps the residual stream's entry on the NPU)
    embeds_layout: str = EMBEDS_BY_POSITION


@dataclass(frozen=True)
class Audio8StepFields(Audio8Fields):
    bucket: int  # the K/V buffers' length Smax this step graph takes


@dataclass(frozen=True)
class Audio8HeadFields(Audio8Fields):
    shard: int  # the shard's place among head_shards (its contract's ladder_key too)
    rows: List[int]  # [start, stop): the vocabulary rows whose logits the shard gives


def graph_key(contract: EngineContract) -> tuple:
    """What the runtime asks for a graph by: (component, role, ladder_key) of its contract (of a shape set's view,
    for an engine compiled for several sets)."""
    return (contract.component, contract.role, contract.ladder_key)


def step_key(bucket: int) -> tuple:
    return ("decoder", f"step_{bucket}", None)


def rope_tables(positions, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [len(positions), head_dim] in float32, as transformers' default rotary embedding computes them."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    freqs = np.asarray(positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def placeholder_count(samples: int, hop: int) -> int:
    """Audio placeholders for `samples`: 25/50/75/100 for 2/4/6/8 s at 16 kHz with hop 160 (37 for 3 s)."""
    return max((((samples // hop) + 1) // 2) // 4, 1)


def pooling_matrix(source: int, target: int) -> np.ndarray:
    """P [target, source] (float64) with P @ x == adaptive average pooling of x's rows to `target` rows
    (torch's adaptive_avg_pool1d windows: floor(i * source / target) .. ceil((i + 1) * source / target))."""
    matrix = np.zeros((target, source), dtype=np.float64)
    for row in range(target):
        start = (row * source) // target
        stop = -((-(row + 1) * source) // target)
        matrix[row, start:stop] = 1.0 / (stop - start)
    return matrix


def padded_pooling(source: int, target: int, rows: int) -> np.ndarray:
    """The adapter's `pool` input: `pooling_matrix(source, target)` in float32, zero rows below it to `rows`."""
    if not 1 <= target <= rows:
        raise BucketError(f"{target} audio placeholders do not fit the adapter's {rows} rows")
    padded = np.zeros((rows, source), dtype=np.float32)
    padded[:target] = pooling_matrix(source, target)
    return padded


def mel_chunks(features: np.ndarray, chunk_frames: int) -> np.ndarray:
    """The encoder's input [chunks, 1, mel, chunk_frames] from log-mel features [mel, frames] (frames a multiple
    of chunk_frames): consecutive runs of chunk_frames frames, each its own convolution image."""
    mel, frames = features.shape
    return np.ascontiguousarray(features.reshape(mel, frames // chunk_frames, chunk_frames).transpose(1, 0, 2)[:, None])


@dataclass
class Timings:
    """Milliseconds per stage; per-token stages are summed over the tokens decoded."""

    encoder_ms: float = 0.0
    adapter_ms: float = 0.0
    prefill_ms: float = 0.0  # the prefill and the head shard calls of the first token
    step_ms: float = 0.0  # the step graph: every layer of one token
    head_ms: float = 0.0
    kv_write_ms: float = 0.0
    load_ms: float = 0.0  # opening graphs on first use (not part of any stage)
    decode_steps: int = 0
    migrations: list[dict] = field(default_factory=list)  # {"from", "to", "position", "ms"}

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Decoded:
    tokens: list[int]
    buckets: list[int]  # buckets used, in order
    timings: Timings
    step_logits: list[np.ndarray] = field(default_factory=list)  # [vocab] per emitted token, when kept


class Audio8Runtime:
    """Everything after the mel features. `backend_for(path)` opens one graph (an `.onnx` or `.rknn` path
    from the plan directory): `rkaudio.host.backends.OnnxBackend` on the host, `rkaudio.board.rknnlite.
    RknnLiteBackend` on a board. Use as a context manager to release backends.

    Or, without a plan directory, over `engines` (`rkaudio.board.golden.Engine`s: each runs one graph, known by its
    contract's component/role/ladder_key, and opens its backend itself) with `embed_table` (indexable like the
    [vocab, hidden] table: `table[ids]`, `table[id]`).

    `fields` are the shapes, buckets and prompt every graph's contract carries (`Audio8Fields`), read off the
    first graph."""

    def __init__(self, plan_dir: Path | None = None, backend_for: Callable | None = None, artifact: str = "onnx",
                 engines: list | None = None, embed_table=None):
        self.artifact = artifact
        self._backend_for = backend_for
        self._open: dict[tuple, object] = {}
        if engines is not None:
            if not engines or embed_table is None:
                raise SetupError("an Audio8Runtime over engines needs the engines and the embedding table")
            self.plan_dir, self.plan = None, None
            self.fields = Audio8Fields.of(engines[0].contract)
            self._embed_table = embed_table
            self.graphs = {graph_key(engine.contract): engine for engine in engines}
            return
        if backend_for is None:
            raise SetupError("an Audio8Runtime over a plan directory needs backend_for, what opens each graph "
                             "(rkaudio.host.backends.OnnxBackend for .onnx, rkaudio.board.rknnlite.RknnLiteBackend "
                             "for .rknn)")
        self.plan_dir = Path(plan_dir)
        plan_path = self.plan_dir / PLAN_FILE
        if not plan_path.is_file():
            raise SetupError(f"no {PLAN_FILE} in {self.plan_dir}: export the graphs with `convert audio8 ...`")
        self.plan = json.loads(plan_path.read_text())
        contracts = [EngineContract.from_json(entry["contract"]) for entry in self.plan["graphs"]]
        self.fields = Audio8Fields.of(contracts[0])
        self._embed_table = np.load(self.plan_dir / self.plan["embed_table"], mmap_mode="r")
        self.graphs = {graph_key(contract): entry for contract, entry in zip(contracts, self.plan["graphs"])}

    # ------------------------------------------------------------ backends, lazily
    def _run(self, key: tuple, feeds: dict, timings: "Timings", stage: str) -> dict:
        """Run one graph, opening it on first use; loading and running are timed apart."""
        backend = self._backend(key, timings)
        start = time.perf_counter()
        outputs = backend.run(feeds)
        setattr(timings, stage, getattr(timings, stage) + _ms_since(start))
        return outputs

    def _backend(self, key: tuple, timings: "Timings"):
        """The graph's backend, opened on first use (timed as loading)."""
        self._graph(key)
        backend = self._open.get(key)
        if backend is None:
            start = time.perf_counter()
            backend = self._open[key] = self._open_graph(key)
            timings.load_ms += _ms_since(start)
        return backend

    def _buffer_dtypes(self, bucket: int, timings: "Timings") -> tuple[np.dtype, np.dtype]:
        """(K/V, mask) dtypes: those the bucket's step graph takes them in (`input_dtypes` of its backend: fp32 for
        an fp32 ONNX on onnxruntime, the manifest's fed dtype for an engine)."""
        fed = self._backend(step_key(bucket), timings).input_dtypes
        return np.dtype(fed["full_k_0"]), np.dtype(fed["mask"])

    def _contract(self, key: tuple) -> EngineContract:
        """The contract of graph `key` (its plan entry's, or its Engine's)."""
        graph = self._graph(key)
        return graph.contract if self.plan_dir is None else EngineContract.from_json(graph["contract"])

    def _graph(self, key: tuple):
        """The plan entry or Engine of graph `key`."""
        if key not in self.graphs:
            where = f"the plan in {self.plan_dir}" if self.plan_dir is not None else "the engines given"
            raise SetupError(f"{where} has no graph {key}")
        return self.graphs[key]

    def _file(self, key: tuple) -> str:
        """The file that runs graph `key`: an engine compiled for several shape sets (`--ladder dynamic`) runs the
        graphs of all its sets, each bucket's step for one."""
        graph = self._graph(key)
        return graph.name if self.plan_dir is None else graph[self.artifact]

    def _open_graph(self, key: tuple):
        if self.plan_dir is None:
            # an Engine: runs itself (its backend opens on its first run, closes on release); the views of one
            # engine share its backend
            return self.graphs[key]
        shared = next((backend for open_key, backend in self._open.items()
                       if self._file(open_key) == self._file(key)), None)
        if shared is not None:
            return shared
        path = self.plan_dir / self.graphs[key][self.artifact]
        if not path.is_file():
            raise SetupError(f"no {path.name} in {self.plan_dir}: build the engines with `convert audio8` "
                             "(without --skip-rknn)")
        return self._backend_for(path)

    def loaded(self) -> list[tuple]:
        return list(self._open)

    def release(self, component: str | None = None, role: str | None = None) -> None:
        """Release the open graphs of `component` and/or `role` (all when neither is given), closing each file no
        graph still open runs."""
        for key in [k for k in self._open if component in (None, k[0]) and role in (None, k[1])]:
            backend = self._open.pop(key)
            if any(self._file(open_key) == self._file(key) for open_key in self._open):
                continue
            close = getattr(backend, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        self.release()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    # ------------------------------------------------------------ frontend
    def check_audio(self, samples: int) -> int:
        """Placeholder count N for `samples` (any clip up to the encoder's frame count), or a BucketError."""
        fields = self.fields
        rate, max_samples = fields.sample_rate, fields.max_frames * fields.hop
        if samples <= 0:
            raise BucketError("the audio is empty: nothing to transcribe")
        if samples > max_samples:
            seconds = max_samples / rate
            raise BucketError(f"audio of {samples / rate:.2f} s is longer than the {seconds:g} s the encoder takes "
                              f"({fields.max_frames} mel frames): split it into clips of at most {seconds:g} s, "
                              f"best at pauses (e.g. `sox in.wav part.wav trim 0 {seconds:g} : newfile : restart`), "
                              "and transcribe each clip")
        placeholders = placeholder_count(samples, fields.hop)
        if placeholders > fields.max_placeholders:  # a plan whose encoder and adapter disagree
            raise BucketError(f"{samples} samples give {placeholders} audio placeholders, more than the adapter's "
                              f"{fields.max_placeholders} rows")
        return placeholders

    def prompt_ids(self, placeholders: int) -> list[int]:
        return self.fields.prompt.ids(placeholders)

    def _pooling(self, placeholders: int) -> np.ndarray:
        """The adapter's `pool` input [1, rows, tokens] for N placeholders: adaptive average pooling of the
        encoder's tokens to N rows, zero-padded to the adapter's rows. One method, so a test can plant the
        first-N-rows mistake."""
        return padded_pooling(self.fields.audio_tokens, placeholders, self.fields.max_placeholders)[None]

    def prompt_embeddings(self, features: np.ndarray, placeholders: int, timings: Timings) -> np.ndarray:
        """Encoder (features zero-padded to the fixed frame count) -> the adapter pooled to N -> inputs_embeds
        [1, S, hidden], S = N + the prompt's template tokens."""
        fields = self.fields
        if features.shape[1] > fields.max_frames:
            raise BucketError(f"{features.shape[1]} mel frames exceed the encoder's {fields.max_frames}")
        padded = np.zeros((fields.mel_bins, fields.max_frames), dtype=np.float32)
        padded[:, : features.shape[1]] = features
        audio_hidden = self._run(("encoder", "main", None), {"mel_chunks": mel_chunks(padded, fields.chunk_frames)},
                                 timings, "encoder_ms")["audio_hidden"]
        audio = self._run(("adapter", "main", None), {"audio_hidden": audio_hidden,
                                                      "pool": self._pooling(placeholders)},
                          timings, "adapter_ms")["audio_embeddings"]
        if audio.shape[0] != fields.max_placeholders:
            raise BucketError(f"adapter gave {audio.shape[0]} audio rows, its contract says {fields.max_placeholders}")
        ids = np.array(self.prompt_ids(placeholders))
        slots = ids == fields.prompt.audio_token_id
        embeds = self.token_embeddings(ids)
        embeds[slots] = audio[: int(slots.sum())]  # rows past N pooled nothing (zero rows of `pool`)
        return embeds[None]

    def token_embeddings(self, ids) -> np.ndarray:
        """The table's rows of `ids` [..., hidden] as fp32 (the table is stored in fp16)."""
        return np.array(self._embed_table[np.asarray(ids, dtype=np.int64)], dtype=np.float32)

    def transcribe(self, features: np.ndarray, samples: int, max_new_tokens: int, **decode) -> Decoded:
        timings = Timings()
        embeds = self.prompt_embeddings(features, self.check_audio(samples), timings)
        return self.decode(embeds, max_new_tokens, timings=timings, **decode)

    # ------------------------------------------------------------ decoder
    def _head(self, hidden: np.ndarray, timings: Timings, stage: str) -> np.ndarray:
        """Logits [vocab]: the final RMSNorm and LM head of `hidden` [1, 1, hidden], shard by shard."""
        return np.concatenate([self._run(("decoder", "head", shard), {"hidden": hidden}, timings, stage)
                               ["logits"].reshape(-1) for shard in range(self.fields.head_shards)])

    def prefill(self, inputs_embeds: np.ndarray, timings: Timings) -> tuple[np.ndarray, dict]:
        """The one prefill over the prompt right-padded to its S: the last real position's hidden state
        [1, 1, hidden] (one-hot selector through a MatMul) and every layer's K/V [heads, S, head_dim]."""
        fields = self.fields
        length, size = inputs_embeds.shape[1], fields.prompt_length
        if length > size:
            raise BucketError(f"a {length}-token prompt is longer than the prefill's {size} positions")
        padded = np.zeros((1, size, inputs_embeds.shape[2]), np.float32)
        padded[:, :length] = inputs_embeds
        select = np.zeros((1, size), np.float32)
        select[0, length - 1] = 1.0
        cos, sin = rope_tables(np.arange(size), fields.head_dim, fields.rope_theta)
        key = ("prefill", "main", None)
        if Audio8PrefillFields.of(self._contract(key)).embeds_layout == EMBEDS_BY_CHANNEL:
            padded = np.ascontiguousarray(padded.transpose(0, 2, 1))
        outputs = self._run(key, {"inputs_embeds": padded, "cos": cos, "sin": sin, "select": select}, timings,
                            "prefill_ms")
        return outputs["last_hidden"].reshape(1, 1, -1), outputs

    def decode(self, inputs_embeds: np.ndarray, max_new_tokens: int, ignore_eos: bool = False,
               keep_logits: bool = False, timings: Timings | None = None) -> Decoded:
        """Greedy tokens after the prompt, EOS included (or exactly `max_new_tokens` with `ignore_eos`)."""
        fields = self.fields
        timings = timings or Timings()
        length = inputs_embeds.shape[1]
        buckets = sorted(fields.kv_buckets)
        bucket = next((b for b in buckets if b > length), None)
        if bucket is None:
            raise BucketError(f"a {length}-token prompt leaves no room in the largest K/V bucket {buckets[-1]}")
        hidden, prefill = self.prefill(inputs_embeds, timings)
        for component in ("encoder", "adapter", "prefill"):
            self.release(component)
        shape = (fields.heads, bucket, fields.head_dim)
        kv_dtype, mask_dtype = self._buffer_dtypes(bucket, timings)
        keys = [np.zeros(shape, kv_dtype) for _ in range(fields.layers)]
        values = [np.zeros(shape, kv_dtype) for _ in range(fields.layers)]
        for layer in range(fields.layers):  # the prefill's rows past the prompt are padding
            keys[layer][:, :length] = prefill[f"key_{layer}"][:, :length]
            values[layer][:, :length] = prefill[f"value_{layer}"][:, :length]
        mask = np.full((fields.heads, 1, bucket), fields.mask_value, mask_dtype)
        mask[:, :, :length] = 0.0
        logits = self._head(hidden, timings, "prefill_ms")
        tokens, used, kept = [int(np.argmax(logits))], [bucket], [logits] if keep_logits else []
        eos = fields.prompt.eos_token_id
        position = length
        while len(tokens) < max_new_tokens and (ignore_eos or tokens[-1] != eos):
            if position >= bucket:
                bucket, keys, values, mask = self._migrate(bucket, position, keys, values, mask, timings)
                used.append(bucket)
            cos, sin = self._rope(position)
            feeds = {"hidden": self.token_embeddings(tokens[-1]).reshape(1, 1, -1), "cos": cos, "sin": sin,
                     "mask": mask}
            for layer in range(fields.layers):
                feeds[f"full_k_{layer}"], feeds[f"full_v_{layer}"] = keys[layer], values[layer]
            step = self._run(step_key(bucket), feeds, timings, "step_ms")
            start = time.perf_counter()
            for layer in range(fields.layers):  # this position's rows, written after the step that computed them
                keys[layer][:, position] = step[f"key_delta_{layer}"][:, 0]
                values[layer][:, position] = step[f"value_delta_{layer}"][:, 0]
            mask[:, :, position] = 0.0
            timings.kv_write_ms += _ms_since(start)
            logits = self._head(step["hidden_out"], timings, "head_ms")
            tokens.append(int(np.argmax(logits)))
            kept += [logits] if keep_logits else []
            timings.decode_steps += 1
            position += 1
        return Decoded(tokens, used, timings, kept)

    def _rope(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [1, head_dim] of the token decoded at `position` (its K/V row and its query). One method, so
        a test can plant a position fault (the family's step-logit gate must catch it)."""
        return rope_tables([position], self.fields.head_dim, self.fields.rope_theta)

    def _migrate(self, bucket, position, keys, values, mask, timings):
        """Release the old step graph, then copy every layer's valid K/V rows into the next bucket's buffers (in
        the dtypes that bucket's step graph takes them in: opening it here, one step graph open at a time). One
        engine compiled for both buckets' shapes stays open: reloading it would only cost its init."""
        larger = [b for b in sorted(self.fields.kv_buckets) if b > bucket]
        if not larger:
            raise BucketError(f"decoding reached position {position}, past the largest K/V bucket {bucket}: "
                              "export a larger --kv-buckets entry or lower max_new_tokens")
        grown = larger[0]
        if self._file(step_key(bucket)) == self._file(step_key(grown)):
            self._backend(step_key(grown), timings)
        self.release(role=f"step_{bucket}")
        kv_dtype, mask_dtype = self._buffer_dtypes(grown, timings)
        start = time.perf_counter()
        heads, _, head_dim = keys[0].shape
        new_keys, new_values = [], []
        for key, value in zip(keys, values):
            for old, store in ((key, new_keys), (value, new_values)):
                buffer = np.zeros((heads, grown, head_dim), kv_dtype)
                buffer[:, :position] = old[:, :position]
                store.append(buffer)
        new_mask = np.full((heads, 1, grown), self.fields.mask_value, mask_dtype)
        new_mask[:, :, :position] = mask[:, :, :position]
        timings.migrations.append({"from": bucket, "to": grown, "position": position, "ms": _ms_since(start)})
        return grown, new_keys, new_values, new_mask


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


class EmbeddingRows:
    """The rows of the [vocab, hidden] embedding table that one short run reads (an end-to-end golden's: the
    prompt ids and the tokens it feeds back), indexed like the full table. A token outside them (a board run
    that decoded differently from the recorded one) reads zeros, so the loop still makes the same calls; its
    tokens already differ, which the token gate judges at the first difference."""

    def __init__(self, ids, rows):
        rows = np.asarray(rows, dtype=np.float32)
        self._index = {int(token): number for number, token in enumerate(np.asarray(ids).reshape(-1))}
        self._rows = np.concatenate([rows, np.zeros((1, rows.shape[1]), np.float32)])  # last: the zero row

    def __getitem__(self, ids):
        ids = np.asarray(ids)
        missing = len(self._rows) - 1
        positions = [self._index.get(int(token), missing) for token in ids.reshape(-1)]
        return self._rows[np.asarray(positions, dtype=np.int64).reshape(ids.shape)]


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of Audio8: the probe clip `inputs["audio"]` (mono 16 kHz) through the log-mel frontend
    and `Audio8Runtime.transcribe` over `engines` (encoder -> adapter -> prefill -> per token: the K/V bucket's
    step graph -> head shards), decoding exactly `params["tokens"]` greedy tokens
    with EOS ignored, so the number of engine calls is fixed whatever the engines return. The embedding rows it
    reads come as `inputs["embed_ids"]` / `inputs["embed_rows"]` (EmbeddingRows; the full table is too large for
    a golden). Returns `tokens` and `tokens.margin`: the fp32 top-1 minus top-2 logit of each step, so the kit
    passes a difference at a step whose margin is within `params["tie_margin"]` as an fp16 tie."""
    audio = np.asarray(inputs["audio"], dtype=np.float32).reshape(-1)
    table = EmbeddingRows(inputs["embed_ids"], inputs["embed_rows"])
    with Audio8Runtime(engines=engines, embed_table=table) as runtime:
        features = log_mel(audio, runtime.fields.mel_bins)
        decoded = runtime.transcribe(features, audio.size, int(params["tokens"]), ignore_eos=True, keep_logits=True)
    top = np.sort(np.stack(decoded.step_logits).astype(np.float32), axis=-1)
    return {"tokens": np.asarray(decoded.tokens, dtype=np.int64), "tokens.margin": top[:, -1] - top[:, -2]}
