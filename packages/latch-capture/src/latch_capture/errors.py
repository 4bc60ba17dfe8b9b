"""The one exception capture raises for anything the user can fix.

Every message names the culprit (the torch op, the value or argument, the user's source line when
known) and says what to do, in one paragraph:

    capture: unsupported op aten.topk at models/moe.py:41 in forward: Latch has no lowering for it;
    use latch_ops.moe's token_topk (a custom op with a static-shape derivative rule) instead.
"""

from __future__ import annotations
from latch_core.errors import UserError


class CaptureError(UserError):
    """A capture failure the user can act on.

    ``op`` is the torch op (``aten.topk``) or argument at fault, ``source`` the user's
    ``file.py:LINE in function``, ``hint`` what to do about it.
    """

    def __init__(self, what: str, *, op: str | None = None, source: str | None = None, hint: str | None = None):
        self.what = what
        self.op = op
        self.source = source
        self.hint = hint
        where = f" at {source}" if source else ""
        culprit = f" {op}" if op else ""
        msg = f"capture: {what}{culprit}{where}"
        if hint:
            msg += f": {hint}"
        super().__init__(msg)
