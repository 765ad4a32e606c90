"""The language-model workload's parts: packed token sequences read from a text data set, and a
decoder-only transformer (GPT-2's architecture).

A text data set (``codl.datasets``, kind ``text``) is one UTF-8 file of documents back to back
(``documents.txt``), their byte offsets (``offsets.npy``) and the byte-level BPE trained on them
(``tokenizer.json``, the ``tokenizers`` package). Sample ``i`` is the sequence that starts at
document ``i``: the loader worker reads the bytes of documents ``i, i+1, ...`` (fetch), encodes
them one by one with the BPE until it holds ``seq_len + 1`` tokens (decode: the real CPU work of
an LM input pipeline), and packs them, each document followed by the end-of-text token, into
one sequence cut to length, whose shift by one is the target (transform). Consecutive samples
overlap in text, as windows over one token stream do.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import Dataset

from codl.errors import DataSetError
from codl.harness.data import timing_row
from codl.paths import DATASET_MANIFEST
from codl.trace.clock import now_ns

DOCUMENTS = "documents.txt"
OFFSETS = "offsets.npy"
TOKENIZER = "tokenizer.json"
END_OF_TEXT = "<|endoftext|>"
# Bytes read per sample: the corpus's mean bytes per token times the sequence, with this margin;
# a sample whose documents tokenize shorter reads on (inside decode), rare at this margin.
_READ_MARGIN = 1.5


class PackedDocuments(Dataset[tuple[torch.Tensor, torch.Tensor, np.ndarray]]):
    """Samples ``(tokens[:-1], tokens[1:], timing row)`` of ``seq_len + 1`` packed tokens."""

    def __init__(self, root: Path, seq_len: int, *, vocab: int) -> None:
        from tokenizers import Tokenizer

        root = Path(root)
        try:
            self.offsets = np.load(root / OFFSETS, allow_pickle=False)
            self.tokenizer = Tokenizer.from_file(str(root / TOKENIZER))
            stats = json.loads((root / DATASET_MANIFEST).read_text()).get("text", {})
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"{exc.filename}: missing; {root} is not a codl text data set "
                f"(expected {DOCUMENTS}, {OFFSETS}, {TOKENIZER}, {DATASET_MANIFEST})"
            ) from None
        except (OSError, ValueError, Exception) as exc:
            raise DataSetError(f"{root}: unreadable text data set ({exc})") from None
        if self.tokenizer.get_vocab_size() > vocab:
            raise DataSetError(
                f"{root / TOKENIZER}: {self.tokenizer.get_vocab_size()} tokens, more than "
                f"workload.classes ({vocab}), the model's vocabulary"
            )
        eot = self.tokenizer.token_to_id(END_OF_TEXT)
        if eot is None:
            raise DataSetError(f"{root / TOKENIZER}: no {END_OF_TEXT} token")
        self.eot = int(eot)
        self.path = str(root / DOCUMENTS)
        self.seq_len = seq_len
        self.size = int(self.offsets[-1])
        bytes_per_token = float(stats.get("bytes_per_token", 4.0))
        self.read_bytes = min(self.size, math.ceil((seq_len + 1) * bytes_per_token * _READ_MARGIN))
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _read(self, start: int, n: int) -> bytes:
        # One descriptor per process, opened on first use: a forked worker opens its own.
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        end = start + n
        if end <= self.size:
            return os.pread(self._fd, n, start)
        # Wrap around: the stream of documents continues at the first.
        return os.pread(self._fd, self.size - start, start) + os.pread(self._fd, end - self.size, 0)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        need = self.seq_len + 1
        start = int(self.offsets[index])
        t0 = now_ns()
        raw = self._read(start, self.read_bytes)
        t1 = now_ns()
        ids: list[int] = []
        cursor = (start + len(raw)) % self.size  # where a further read continues
        doc = index
        while len(ids) < need:
            length = int(self.offsets[doc + 1] - self.offsets[doc])
            while len(raw) < length:
                # These documents tokenized shorter than the corpus's mean: read on.
                more = self._read(cursor, self.read_bytes)
                raw, cursor = raw + more, (cursor + len(more)) % self.size
            text = raw[:length].decode("utf-8")
            raw = raw[length:]
            ids += self.tokenizer.encode(text, add_special_tokens=False).ids
            ids.append(self.eot)
            doc = (doc + 1) % len(self)
        t2 = now_ns()
        tokens = torch.tensor(ids[:need], dtype=torch.long)
        x, y = tokens[:-1].clone(), tokens[1:].clone()
        t3 = now_ns()
        return x, y, timing_row(index, t0, t1, t2, t3)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None}


@dataclass(frozen=True)
class GptShape:
    vocab: int
    seq_len: int
    layers: int
    heads: int
    width: int


class _Block(nn.Module):
    def __init__(self, shape: GptShape) -> None:
        super().__init__()
        d = shape.width
        self.heads = shape.heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.out(functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return out


class Gpt(nn.Module):
    """GPT-2's decoder: learned positions, pre-norm blocks, causal attention (torch's fused
    scaled-dot-product kernels), a head tied to the token embedding; GPT-2's initialisation."""

    def __init__(self, shape: GptShape) -> None:
        super().__init__()
        self.shape = shape
        self.tokens = nn.Embedding(shape.vocab, shape.width)
        self.positions = nn.Embedding(shape.seq_len, shape.width)
        self.blocks = nn.ModuleList(_Block(shape) for _ in range(shape.layers))
        self.ln = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, shape.vocab, bias=False)
        self.head.weight = self.tokens.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # Residual projections scaled by depth, as GPT-2 does.
                std = (
                    0.02 / math.sqrt(2 * shape.layers)
                    if name.endswith(("proj.weight", "out.weight"))
                    else 0.02
                )
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln(x))
        return logits


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over every position."""
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
