"""Representative models of the kinds Baechi measured, written out by architecture.

Every factory takes `batch` (and shape keywords) and returns ``(module, example_inputs)``, so that
``plinth place plinth.place.models:transformer`` works as it is. Nothing is downloaded; weights are
random (placement needs shapes and costs, not trained values).

- `transformer`: GPT-2-small-like decoder (12 layers, width 768, 12 heads); `transformer_deep` is
  the same width at 48 layers. The output head is not tied to the embedding, so that the two can
  sit on different devices.
- `inception_v3`: the Inception-V3 layout (stem, 3 x A, grid reduction, 4 x factorised-7x7 C,
  grid reduction, 2 x expanded E, classifier); conv-BN-ReLU units are atomic.
- `gnmt`: a GNMT-style encoder-decoder: stacked LSTMs unrolled over time, residual connections from
  the third layer up, additive-free (dot) attention fed from the bottom decoder layer. The cells
  use their weights through plain tensor code, so one layer's steps can run on several devices and
  the weights travel, as in the TensorFlow graphs Baechi placed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------- Transformer (GPT-2-like)


class CausalSelfAttention(nn.Module):
    plinth_atomic = True  # q/k/v/softmax inside one head group: no value in splitting

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, *, vocab: int, seq: int, d: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("positions", torch.arange(seq), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(self.positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def transformer(batch: int = 8, *, layers: int = 12, d_model: int = 768, heads: int = 12,
                seq: int = 128, vocab: int = 50257, seed: int = 0):
    """GPT-2-small-like: 12 layers, width 768, 12 heads, 50,257-token vocabulary."""
    torch.manual_seed(seed)
    model = GPT(vocab=vocab, seq=seq, d=d_model, heads=heads, layers=layers)
    return model, (torch.randint(0, vocab, (batch, seq)),)


def transformer_deep(batch: int = 8, **kw):
    """The GPT-2-small width at 48 layers."""
    return transformer(batch, **{"layers": 48, **kw})


# ---------------------------------------------------------------- Inception-V3


class ConvBN(nn.Module):
    plinth_atomic = True

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


def _seq(*units: nn.Module) -> nn.Sequential:
    return nn.Sequential(*units)


class BlockA(nn.Module):
    """35x35: 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | pool-1x1. Widths are nominal, divided by `s`."""

    def __init__(self, cin: int, pool: int, s: int = 1) -> None:
        super().__init__()
        cin, pool = cin // s, pool // s
        c48, c64, c96 = 48 // s, 64 // s, 96 // s
        self.b1 = ConvBN(cin, c64, 1)
        self.b5 = _seq(ConvBN(cin, c48, 1), ConvBN(c48, c64, 5, padding=2))
        self.b3 = _seq(ConvBN(cin, c64, 1), ConvBN(c64, c96, 3, padding=1),
                       ConvBN(c96, c96, 3, padding=1))
        self.bp = ConvBN(cin, pool, 1)

    def forward(self, x):
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), p], 1)


class ReduceB(nn.Module):
    """35 -> 17 grid reduction: strided 3x3 | 1x1-3x3-strided 3x3 | max pool."""

    def __init__(self, cin: int, s: int = 1) -> None:
        super().__init__()
        cin, c64, c96 = cin // s, 64 // s, 96 // s
        self.b3 = ConvBN(cin, 384 // s, 3, stride=2)
        self.bd = _seq(ConvBN(cin, c64, 1), ConvBN(c64, c96, 3, padding=1),
                       ConvBN(c96, c96, 3, stride=2))

    def forward(self, x):
        return torch.cat([self.b3(x), self.bd(x), F.max_pool2d(x, 3, stride=2)], 1)


class BlockC(nn.Module):
    """17x17 with 7x7 convolutions factorised into 1x7 and 7x1."""

    def __init__(self, cin: int, c7: int, s: int = 1) -> None:
        super().__init__()
        cin, c7, c192 = cin // s, c7 // s, 192 // s
        row, col = {"padding": (0, 3)}, {"padding": (3, 0)}
        self.b1 = ConvBN(cin, c192, 1)
        self.b7 = _seq(ConvBN(cin, c7, 1), ConvBN(c7, c7, (1, 7), **row),
                       ConvBN(c7, c192, (7, 1), **col))
        self.b77 = _seq(ConvBN(cin, c7, 1), ConvBN(c7, c7, (7, 1), **col),
                        ConvBN(c7, c7, (1, 7), **row), ConvBN(c7, c7, (7, 1), **col),
                        ConvBN(c7, c192, (1, 7), **row))
        self.bp = ConvBN(cin, c192, 1)

    def forward(self, x):
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b7(x), self.b77(x), p], 1)


class ReduceD(nn.Module):
    """17 -> 8 grid reduction."""

    def __init__(self, cin: int, s: int = 1) -> None:
        super().__init__()
        cin, c192 = cin // s, 192 // s
        self.b3 = _seq(ConvBN(cin, c192, 1), ConvBN(c192, 320 // s, 3, stride=2))
        self.b7 = _seq(ConvBN(cin, c192, 1), ConvBN(c192, c192, (1, 7), padding=(0, 3)),
                       ConvBN(c192, c192, (7, 1), padding=(3, 0)),
                       ConvBN(c192, c192, 3, stride=2))

    def forward(self, x):
        return torch.cat([self.b3(x), self.b7(x), F.max_pool2d(x, 3, stride=2)], 1)


class BlockE(nn.Module):
    """8x8 with the filter bank expanded: 3x3 split into parallel 1x3 and 3x1."""

    def __init__(self, cin: int, s: int = 1) -> None:
        super().__init__()
        cin, c384 = cin // s, 384 // s
        row, col = {"padding": (0, 1)}, {"padding": (1, 0)}
        self.b1 = ConvBN(cin, 320 // s, 1)
        self.b3 = ConvBN(cin, c384, 1)
        self.b3a, self.b3b = ConvBN(c384, c384, (1, 3), **row), ConvBN(c384, c384, (3, 1), **col)
        self.bd = _seq(ConvBN(cin, 448 // s, 1), ConvBN(448 // s, c384, 3, padding=1))
        self.bda, self.bdb = ConvBN(c384, c384, (1, 3), **row), ConvBN(c384, c384, (3, 1), **col)
        self.bp = ConvBN(cin, 192 // s, 1)

    def forward(self, x):
        s, d = self.b3(x), self.bd(x)
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b3a(s), self.b3b(s), self.bda(d), self.bdb(d), p], 1)


class InceptionV3(nn.Module):
    def __init__(self, classes: int = 1000, s: int = 1) -> None:
        super().__init__()
        c32, c64 = 32 // s, 64 // s
        self.stem = _seq(ConvBN(3, c32, 3, stride=2), ConvBN(c32, c32, 3),
                         ConvBN(c32, c64, 3, padding=1), nn.MaxPool2d(3, 2),
                         ConvBN(c64, 80 // s, 1), ConvBN(80 // s, 192 // s, 3), nn.MaxPool2d(3, 2))
        self.blocks = _seq(BlockA(192, 32, s), BlockA(256, 64, s), BlockA(288, 64, s),
                           ReduceB(288, s), BlockC(768, 128, s), BlockC(768, 160, s),
                           BlockC(768, 160, s), BlockC(768, 192, s), ReduceD(768, s),
                           BlockE(1280, s), BlockE(2048, s))
        self.fc = nn.Linear(2048 // s, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def inception_v3(batch: int = 8, *, image: int = 299, classes: int = 1000, narrow: int = 1,
                 seed: int = 0):
    """Inception-V3 layout at 299x299; `narrow` (1, 2, 4, 8 or 16) divides every width (tests)."""
    if narrow not in (1, 2, 4, 8, 16):
        raise ValueError(f"narrow: expected 1, 2, 4, 8 or 16, got {narrow}")
    torch.manual_seed(seed)
    return InceptionV3(classes, narrow), (torch.randn(batch, 3, image, image),)


# ---------------------------------------------------------------- GNMT


class Cell(nn.Module):
    """One LSTM layer's weights; the step is plain tensor code so that fx unrolls it."""

    def __init__(self, cin: int, hidden: int) -> None:
        super().__init__()
        k = 1.0 / math.sqrt(hidden)
        self.w = nn.Parameter(torch.empty(4 * hidden, cin + hidden).uniform_(-k, k))
        self.b = nn.Parameter(torch.zeros(4 * hidden))

    def forward(self, x, h, c):
        i, f, g, o = F.linear(torch.cat([x, h], 1), self.w, self.b).chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class GNMT(nn.Module):
    def __init__(self, *, vocab: int, hidden: int, layers: int, src_len: int,
                 tgt_len: int) -> None:
        super().__init__()
        self.hidden, self.src_len, self.tgt_len = hidden, src_len, tgt_len
        self.src_emb, self.tgt_emb = nn.Embedding(vocab, hidden), nn.Embedding(vocab, hidden)
        self.enc = nn.ModuleList(Cell(hidden, hidden) for _ in range(layers))
        # The bottom decoder layer reads the previous attention context (input feeding).
        self.dec = nn.ModuleList(Cell(2 * hidden, hidden)
                                 for i in range(layers))
        self.out = nn.Linear(2 * hidden, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        b, hsz = src.shape[0], self.hidden
        zero = src.new_zeros(b, hsz, dtype=torch.float32)
        emb = self.src_emb(src)
        xs = [emb[:, t] for t in range(self.src_len)]  # a fixed length, so fx can unroll it
        for i, cell in enumerate(self.enc):
            h = c = zero
            outs = []
            for x in xs:
                h, c = cell(x, h, c)
                outs.append(h + x if i >= 2 else h)  # residual from the third layer up
            xs = outs
        memory = torch.stack(xs, 1)                         # b, src_len, hidden
        state = [(zero, zero) for _ in self.dec]
        ctx = zero
        logits = []
        temb = self.tgt_emb(tgt)
        for y in (temb[:, t] for t in range(self.tgt_len)):
            h0, c0 = self.dec[0](torch.cat([y, ctx], 1), *state[0])
            state[0] = (h0, c0)
            score = torch.softmax(torch.bmm(memory, h0.unsqueeze(2)).squeeze(2), 1)
            ctx = torch.bmm(score.unsqueeze(1), memory).squeeze(1)
            x = h0
            for i in range(1, len(self.dec)):
                h, c = self.dec[i](torch.cat([x, ctx], 1), *state[i])
                state[i] = (h, c)
                x = h + x if i >= 2 else h
            logits.append(self.out(torch.cat([x, ctx], 1)))
        return torch.stack(logits, 1)


def gnmt(batch: int = 8, *, vocab: int = 32000, hidden: int = 1024, layers: int = 4,
         seq: int = 20, seed: int = 0):
    """GNMT-style: 4 encoder and 4 decoder LSTM layers of 1024, `seq` steps each way."""
    torch.manual_seed(seed)
    model = GNMT(vocab=vocab, hidden=hidden, layers=layers, src_len=seq, tgt_len=seq)
    return model, (torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq)))
