"""The two-weight example: y = w2 * (w1 * x), loss = 1/2 (y - t)^2, one SGD step with lr 0.1.

With x = 2, t = 1, w1 = 0.5, w2 = 1.5: y = 1.5, loss = 0.125, dL/dw1 = (y - t) w2 x = 1.5,
dL/dw2 = (y - t) w1 x = 0.5, so w1 -> 0.35, w2 -> 1.45; the next y is 1.015 and the next loss
0.0001125.

    latch-pipeline capture examples/two_weight.py -o two_weight.latch.json
"""

import torch
from torch import nn

from latch_capture import Example
from _optim import sgd


class TwoWeight(nn.Module):
    def __init__(self, w1: float, w2: float, dtype=torch.float32):
        super().__init__()
        self.w1 = nn.Parameter(torch.tensor(w1, dtype=dtype))
        self.w2 = nn.Parameter(torch.tensor(w2, dtype=dtype))

    def forward(self, x):
        return self.w2 * (self.w1 * x)


def objective(y, t):
    return 0.5 * (y - t) ** 2


def build(w1: float = 0.5, w2: float = 1.5, x: float = 2.0, t: float = 1.0, lr: float = 0.1,
          dtype: str = "float32") -> Example:
    dt = getattr(torch, dtype)
    return Example(
        name="two_weight",
        model=TwoWeight(w1, w2, dt),
        objective=objective,
        inputs=torch.tensor(x, dtype=dt),
        targets=torch.tensor(t, dtype=dt),
        optimizer=sgd(),
        hyper={"lr": lr},
    )
