"""CosyVoice3 flow on a ladder of fixed-length estimator engines: pick the smallest rung >= S, right-pad with
mask 0, crop, and run upstream's 10-step cosine Euler ODE with classifier-free guidance over any backend.

One estimator call sees x, mask, mu [B,80,S], the host-made time sinusoid t_freq [B,256], spks [B,80],
cond [B,80,S] and the RoPE tables rope_cos/rope_sin [heads,S,dim_head]; it returns dphi_dt [B,80,S]. CFG
(upstream `solve_euler`): the unconditional row has mu, spks and cond zeroed, and the step uses
(1 + r) * cond_out - r * uncond_out (r = 0.7). A B=2 engine takes both rows in one call, a B=1 engine two
calls. Past the largest rung the ladder refuses (a CPU fallback is the consumer's choice, not ours). A rung
too big to compile whole is split by depth into parts chained through `hidden` (`Chain`; [B,S,dim], or
[B,dim,S] where the contract's io says so).

An engine's contract fields are `RungFields` (where it sits in the ladder, what graph it is) and `FlowFields`
(what the ODE over the ladder reads, the same for every rung).

The initial noise is an input: upstream draws it from seeded torch (`rand_noise`), which numpy cannot
reproduce. numpy and the stdlib only, Python 3.8 (shipped in the board self-test kit)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from rkaudio.board.contract import ContractFields, EngineContract
from rkaudio.board.golden import by_role

INPUT_NAMES = ["x", "mask", "mu", "t_freq", "spks", "cond", "rope_cos", "rope_sin"]
OUTPUT_NAME = "dphi_dt"
HIDDEN_NAME = "hidden"  # [B, S, dim] or [B, dim, S] (the contract's io) between the parts of a split rung
CHAIN_INPUT_NAMES = [HIDDEN_NAME, "mask", "t_freq", "rope_cos", "rope_sin"]  # the inputs of a later part
UNCONDITIONAL_ZEROED = ["mu", "spks", "cond"]  # the CFG row upstream feeds with these zeroed
DEFAULT_STEPS = 10
DEFAULT_CFG_RATE = 0.7
MEL_DIM = 80
FRAME_RATE_HZ = 50  # mel frames per second


@dataclass(frozen=True)
class RungFields(ContractFields):
    """An estimator engine's place in the ladder and its graph: the rung it is compiled for and, for a rung split
    by depth, its part of the chain."""

    length: int                                # the rung: mel frames S the engine is compiled for
    chain: Optional[Dict[str, Any]] = None     # a depth-split rung's {part, parts, blocks, carries}; None: whole
    estimator: Optional[Dict[str, Any]] = None  # the DiT's {dim, depth, heads, dim_head}
    io: Optional[Dict[str, Any]] = None        # the engine's {inputs, outputs}: [{name, shape}, ...] each
    ln_form: Optional[str] = None              # the LayerNorm form in the graph: plain or safe
    parameters: Optional[int] = None           # parameters of the whole estimator

    @property
    def part(self) -> int:
        """The engine's place in its rung's chain (0 for a whole rung)."""
        return int(self.chain["part"]) if self.chain else 0

    @property
    def parts(self) -> int:
        """The engines its rung is split into (1 for a whole rung)."""
        return int(self.chain["parts"]) if self.chain else 1

    def to_fields(self) -> dict:
        """The contract fields an exporter stores: `chain` only for a depth-split rung."""
        fields = super().to_fields()
        if self.chain is None:
            del fields["chain"]
        return fields


@dataclass(frozen=True)
class FlowFields(ContractFields):
    """What the ODE over the ladder reads from any rung's contract (every rung states the same), and how the
    export says it is run."""

    cfg: Dict[str, Any]              # classifier-free guidance: {scheme, rate, uncond_zeroed, combine}
    time: Dict[str, Any]             # the time sinusoid the host makes: {freq_dim, scale, freqs, mlp}
    rope: Dict[str, Any]             # the RoPE tables the host makes: {heads, dim_head, rot_dim, inv_freq, rotated}
    batch: int = 1                   # estimator batch: 1 (CFG as two calls per step) or 2 (both rows in one call)
    mel_dim: int = MEL_DIM           # mel channels of x, mu, cond and the velocity
    frame_rate_hz: int = FRAME_RATE_HZ  # mel frames per second
    ode: Optional[Dict[str, Any]] = None  # the solver upstream runs: {solver, steps, schedule, t_span, noise}
    padding: Optional[str] = None    # how a shorter sequence runs on a rung


class FlowLengthError(ValueError):
    """A sequence longer than the largest rung: the ladder has no engine for it."""


def cosine_schedule(steps: int = DEFAULT_STEPS) -> np.ndarray:
    """t_span = 1 - cos(linspace(0, 1, steps + 1) * pi / 2), float64 (upstream's `t_scheduler: cosine`)."""
    return 1.0 - np.cos(np.linspace(0.0, 1.0, steps + 1) * 0.5 * math.pi)


def time_sinusoid(t, freqs, scale: float) -> np.ndarray:
    """[B, 2*len(freqs)] = cat(sin, cos)(scale * t * freqs), computed in float64 and returned as float32: the
    arguments reach `scale` rad (1000), which fp16 cannot hold, so the engine takes this as an input.
    `freqs` are upstream's float32 frequencies exp(-log(10000) * i / (half - 1)) (the contract carries them)."""
    t = np.atleast_1d(np.asarray(t, dtype=np.float64))
    arguments = (scale * t)[:, None] * np.asarray(freqs, dtype=np.float64)[None, :]
    return np.concatenate([np.sin(arguments), np.cos(arguments)], axis=-1).astype(np.float32)


def rope_tables(length: int, inv_freq, heads: int, dim_head: int):
    """(cos, sin) [heads, length, dim_head] float32 of x-transformers' RoPE applied to q/k at [S, heads*dim_head]
    with rot_dim = 2*len(inv_freq): the first rot_dim channels (head 0 when rot_dim == dim_head) rotate by
    position * inv_freq over interleaved pairs, every other channel has cos 1, sin 0."""
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    rot_dim = 2 * inv_freq.size
    if rot_dim > heads * dim_head or dim_head % 2:
        raise ValueError(f"rot_dim {rot_dim} does not fit {heads} heads of {dim_head}")
    angles = np.repeat(np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :], 2, axis=1)  # [S, rot]
    cos = np.ones((length, heads * dim_head))
    sin = np.zeros((length, heads * dim_head))
    cos[:, :rot_dim], sin[:, :rot_dim] = np.cos(angles), np.sin(angles)

    def per_head(table):
        return np.ascontiguousarray(table.reshape(length, heads, dim_head).transpose(1, 0, 2)).astype(np.float32)

    return per_head(cos), per_head(sin)


class Chain:
    """The parts of one depth-split rung run in order: the first takes the estimator inputs and returns
    `hidden`, each later one takes `hidden` (+ mask, t_freq, RoPE tables) and the last returns dphi_dt. Each
    part gets only its own inputs (its contract's io, or the part's input names)."""

    def __init__(self, parts: List[object]):
        if not parts:
            raise ValueError("a chain needs at least one part")
        self.parts = list(parts)
        self.input_names = list(INPUT_NAMES)
        self.output_names = [OUTPUT_NAME]

    @staticmethod
    def _inputs(part, index: int) -> List[str]:
        contract = getattr(part, "contract", None)
        io = RungFields.of(contract).io if contract is not None else None
        if io:
            return [entry["name"] for entry in io["inputs"]]
        return list(INPUT_NAMES) if index == 0 else list(CHAIN_INPUT_NAMES)

    def run(self, feeds: dict) -> dict:
        current = dict(feeds)
        out = {}
        for index, part in enumerate(self.parts):
            out = part.run({name: current[name] for name in self._inputs(part, index)})
            if index < len(self.parts) - 1:
                current[HIDDEN_NAME] = np.asarray(out[HIDDEN_NAME], dtype=np.float32)
        return {OUTPUT_NAME: out[OUTPUT_NAME]}

    def close(self) -> None:
        for part in self.parts:
            if hasattr(part, "close"):
                part.close()


class FlowLadder:
    """`rungs` maps a compiled length S -> backend (`run(feeds) -> outputs`), or the list of a depth-split rung's
    parts in chain order; `flow` is the engines' shared fields (any rung's): batch, cfg, time and rope."""

    def __init__(self, rungs: Dict[int, object], flow: FlowFields):
        if not rungs:
            raise ValueError("a flow ladder needs at least one rung")
        self.rungs = dict(sorted((int(k), Chain(v) if isinstance(v, (list, tuple)) else v) for k, v in rungs.items()))
        self.batch = flow.batch
        if self.batch not in (1, 2):
            raise ValueError(f"estimator batch {self.batch}: the CFG scheme runs B=1 (two calls) or B=2 (one call)")
        cfg, time, rope = flow.cfg, flow.time, flow.rope
        self.cfg_rate = float(cfg["rate"])
        self.zeroed = list(cfg.get("uncond_zeroed", UNCONDITIONAL_ZEROED))
        self.freqs, self.time_scale = np.asarray(time["freqs"], dtype=np.float64), float(time["scale"])
        self.inv_freq = np.asarray(rope["inv_freq"], dtype=np.float64)
        self.heads, self.dim_head = int(rope["heads"]), int(rope["dim_head"])
        self.mel_dim = flow.mel_dim
        self._tables: Dict[int, tuple] = {}

    @classmethod
    def from_engines(cls, engines: List[object]) -> "FlowLadder":
        """From engines that carry their contract (rkaudio.board.golden.Engine): one rung per contract `length`; the
        parts of a depth-split rung (contract `chain`: part, parts) chained in part order."""
        if not engines:
            raise ValueError("no flow estimator engines")
        grouped: Dict[int, Dict[int, object]] = {}
        counts: Dict[int, int] = {}
        for engine in engines:
            rung = RungFields.of(engine.contract)
            length, part, parts = rung.length, rung.part, rung.parts
            if counts.setdefault(length, parts) != parts or part in grouped.setdefault(length, {}):
                raise ValueError(f"two estimator engines for S={length} part {part} (or disagreeing part counts)")
            grouped[length][part] = engine
        rungs = {}
        for length, parts in grouped.items():
            if sorted(parts) != list(range(counts[length])):
                raise ValueError(f"the S={length} rung has parts {sorted(parts)} of {counts[length]}: incomplete chain")
            rungs[length] = parts[0] if counts[length] == 1 else [parts[i] for i in range(counts[length])]
        return cls(rungs, FlowFields.of(engines[0].contract))

    @property
    def largest(self) -> int:
        return max(self.rungs)

    def rung_for(self, frames: int) -> int:
        """The smallest rung >= frames; past the largest, FlowLengthError naming it."""
        for length in self.rungs:
            if length >= frames:
                return length
        raise FlowLengthError(f"a flow of {frames} frames exceeds the largest estimator rung (S={self.largest}; "
                              f"rungs {', '.join(str(s) for s in self.rungs)}): split the utterance or run the "
                              "estimator on the CPU")

    def tables(self, length: int) -> tuple:
        if length not in self._tables:
            self._tables[length] = rope_tables(length, self.inv_freq, self.heads, self.dim_head)
        return self._tables[length]

    def estimate(self, x, mu, t: float, spks, cond) -> np.ndarray:
        """The CFG-combined velocity [1, mel, L] for x, mu, cond [1, mel, L], spks [1, spk] at time t."""
        frames = x.shape[-1]
        length = self.rung_for(frames)
        cos, sin = self.tables(length)

        def pad(value):
            value = np.asarray(value, dtype=np.float32)
            return np.pad(value, [(0, 0)] * (value.ndim - 1) + [(0, length - frames)])

        mask = np.zeros((1, 1, length), dtype=np.float32)
        mask[..., :frames] = 1.0
        conditional = {"x": pad(x), "mask": mask, "mu": pad(mu), "t_freq": time_sinusoid([t], self.freqs, self.time_scale),
                       "spks": np.asarray(spks, dtype=np.float32), "cond": pad(cond), "rope_cos": cos, "rope_sin": sin}
        unconditional = dict(conditional)
        for name in self.zeroed:
            unconditional[name] = np.zeros_like(conditional[name])
        engine = self.rungs[length]
        if self.batch == 2:
            feeds = dict(conditional)
            for name in ("x", "mask", "mu", "t_freq", "spks", "cond"):
                feeds[name] = np.concatenate([conditional[name], unconditional[name]], axis=0)
            out = np.asarray(engine.run(feeds)[OUTPUT_NAME], dtype=np.float32)
            with_cond, without = out[:1], out[1:2]
        else:
            with_cond = np.asarray(engine.run(conditional)[OUTPUT_NAME], dtype=np.float32)
            without = np.asarray(engine.run(unconditional)[OUTPUT_NAME], dtype=np.float32)
        combined = (1.0 + self.cfg_rate) * with_cond - self.cfg_rate * without
        return combined[..., :frames]

    def solve(self, noise, mu, spks, cond, steps: int = DEFAULT_STEPS,
              trajectory: Optional[list] = None) -> np.ndarray:
        """Upstream's fixed Euler solver on the cosine schedule from `noise` [1, mel, L]: the mel [1, mel, L].
        `trajectory`, when given, receives x after every step (the last one is the mel)."""
        t_span = cosine_schedule(steps)
        x = np.asarray(noise, dtype=np.float32)
        t, dt = t_span[0], t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            x = (x + np.float32(dt) * self.estimate(x, mu, t, spks, cond)).astype(np.float32)
            if trajectory is not None:
                trajectory.append(x)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden: the ODE (`params["steps"]`, default 10) on `inputs` noise, mu, spks, cond through
    the ladder of the flow estimator engines (role main); returns the mel."""
    chosen = by_role(engines, "main", "flow") or list(engines)
    ladder = FlowLadder.from_engines(chosen)
    mel = ladder.solve(inputs["noise"], inputs["mu"], inputs["spks"], inputs["cond"],
                       steps=int(params.get("steps", DEFAULT_STEPS)))
    return {"mel": mel}


def calls_per_solve(contract: EngineContract, steps: int = DEFAULT_STEPS) -> int:
    """Engine calls of one ODE: one per step at B=2, two at B=1; times the parts of a depth-split rung."""
    return steps * (1 if FlowFields.of(contract).batch == 2 else 2) * RungFields.of(contract).parts
