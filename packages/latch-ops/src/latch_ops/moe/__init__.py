"""The MoE ops (token_topk, route_order, ragged_mm), registered as a third party would: their own entry point."""
