"""The MoE ops (token_topk, route_order, ragged_mm and their backwards), shipped as a third party
would ship them: op specs in ``specs`` (no torch), their own ``moe`` entry point in ``plugin``, the
torch references in ``reference`` and the torch.library custom ops in ``torch_ops`` (needs torch;
model code imports it)."""
