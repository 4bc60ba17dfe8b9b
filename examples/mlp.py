"""An MLP classifier trained with AdamW and global-norm clipping (all plain tensor arithmetic).

    x[B, d_in] -> Linear -> GELU(tanh) -> Linear -> GELU(tanh) -> Linear -> logits[B, classes]
    loss = cross_entropy(logits, labels); metric: accuracy (argmax == label)

    latch-pipeline capture examples/mlp.py -o mlp.latch.json [--set batch=64 --set hidden=256]
"""

import torch
import torch.nn.functional as F
from torch import nn

from latch_capture import Example
from _optim import adamw


class MLP(nn.Module):
    def __init__(self, d_in: int, hidden: int, classes: int, layers: int = 2, device=None):
        super().__init__()
        dims = [d_in] + [hidden] * layers + [classes]
        self.layers = nn.ModuleList(nn.Linear(a, b, device=device) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = F.gelu(layer(x), approximate="tanh")
        return self.layers[-1](x)


def objective(logits, labels):
    loss = F.cross_entropy(logits, labels)
    # .to(logits.dtype), not .float(): dtype-generic code keeps the FP64 check in FP64
    accuracy = (logits.argmax(dim=-1) == labels).to(logits.dtype).mean()
    return loss, {"accuracy": accuracy}


def build(batch: int = 16, d_in: int = 32, hidden: int = 64, classes: int = 10, layers: int = 2,
          lr: float = 1e-3, weight_decay: float = 0.01, max_norm: float = 1.0, microbatches: int = 1,
          seed: int = 0, device: str = "cpu") -> Example:
    torch.manual_seed(seed)
    model = MLP(d_in, hidden, classes, layers, device=device)

    def batch_fn(index: int):
        g = torch.Generator().manual_seed(seed * 100_003 + index)
        x = torch.randn(batch, d_in, generator=g)
        y = torch.randint(0, classes, (batch,), generator=g)
        return x, y

    x, y = batch_fn(0)
    return Example(
        name="mlp",
        model=model,
        objective=objective,
        inputs=x,
        targets=y,
        optimizer=adamw(weight_decay=weight_decay, max_norm=max_norm),
        hyper={"lr": lr},
        microbatches=microbatches,
        batch=batch_fn,
    )
