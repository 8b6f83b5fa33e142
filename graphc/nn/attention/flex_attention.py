"""``gc.nn.attention.flex_attention``, as ``torch.nn.attention.flex_attention``: attention whose scores a
``score_mod(score, b, h, q_idx, kv_idx)`` rewrites and a ``mask_mod(b, h, q_idx, kv_idx)`` (kept by a
``BlockMask``) masks. Each is called once, on int64 index Tensors laid out as torch's vmap sees them
(``b [B,1,1,1]``, ``h [1,H,1,1]``, ``q_idx [1,1,Q,1]``, ``kv_idx [1,1,1,KV]``), and what it gives joins
``scaled_dot_product_attention``'s lowering (``graphc.dsl.ops_attention.attend``). The mask is dense: a
BlockMask's block sparsity is how a GPU kernel skips work, and graphc computes every score."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import user_source
from graphc.dsl.devices import check_device
from graphc.dsl.ops_array import arange, dim_positions, full
from graphc.dsl.ops_attention import attend, head_groups
from graphc.dsl.ops_elementwise import isneginf
from graphc.dsl.ops_math import logical_not
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import NARROW, narrowed
from graphc.errors import CaptureError

__all__ = ["BlockMask", "and_masks", "create_block_mask", "create_mask", "flex_attention", "noop_mask", "or_masks"]

_mask_mod_signature = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
_score_mod_signature = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def _refuse(where: str, message: str) -> CaptureError:
    return CaptureError(f"{where}: {message} (at {user_source()})")


def noop_mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Every query attends to every key: a 0-d bool True."""
    return ops.constant(np.array(True))


def _combined(where: str, mask_mods: tuple, join: Callable[[Any, Any], Any], start: bool) -> _mask_mod_signature:
    """The mask_mod joining ``mask_mods``' masks with ``join``, starting from ``start``."""
    if not all(callable(m) for m in mask_mods):
        raise _refuse(where, f"every argument must be a mask_mod (a callable), got {mask_mods!r}")

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        mask = ops.constant(np.array(start))
        for mod in mask_mods:
            mask = join(mask, mod(b, h, q_idx, kv_idx))
        return mask

    return mask_mod


def and_masks(*mask_mods: _mask_mod_signature) -> _mask_mod_signature:
    """A mask_mod attending where every one of ``mask_mods`` does (none: everywhere)."""
    return _combined("and_masks", mask_mods, operator.and_, True)


def or_masks(*mask_mods: _mask_mod_signature) -> _mask_mod_signature:
    """A mask_mod attending where any one of ``mask_mods`` does (none: nowhere)."""
    return _combined("or_masks", mask_mods, operator.or_, False)


def _mod_kind(where: str, fn: Any) -> str:
    """``"mask"`` for a function of 4 positional arguments, ``"score"`` for one of 5, as torch tells them apart."""
    if callable(fn):
        required = [p for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty]
        kind = {4: "mask", 5: "score"}.get(len(required))
        if kind is not None:
            return kind
    raise _refuse(where, f"expected a mask_mod(b, h, q_idx, kv_idx) or score_mod(score, b, h, q_idx, kv_idx), "
                         f"got {fn!r}")


def _grids(positions: list[Tensor]) -> tuple[Tensor, ...]:
    """``b, h, q_idx, kv_idx``: each of the four position vectors along its own dim of four."""
    return tuple(ops.unsqueeze(p, [a for a in range(4) if a != i]) for i, p in enumerate(positions))


def _dims(shape: Any) -> str:
    return "?" if shape is None else f"[{', '.join('?' if d is None else str(d) for d in shape)}]"


def _fits(got: Any, want: list, exact: bool) -> bool:
    """``got`` equals ``want`` (``exact``) or broadcasts to it; unknown dims fit anything."""
    if got is None:
        return True
    if len(got) != len(want) if exact else len(got) > len(want):
        return False
    return all(g is None or w is None or g == w or (not exact and g == 1)
               for g, w in zip(reversed(got), reversed(want)))


def _mask(where: str, mask_mod: _mask_mod_signature, grids: tuple, shape: list) -> Tensor:
    """``mask_mod`` on the index grids: a bool Tensor broadcasting to ``shape`` ``[B, H, Q, KV]``."""
    mask = mask_mod(*grids)
    if not isinstance(mask, Tensor) or mask.dtype != "bool":
        got = f"a {mask.dtype} Tensor" if isinstance(mask, Tensor) else repr(mask)
        raise _refuse(where, f"mask_mod must return a bool Tensor (true: attend), got {got}")
    if not _fits(mask.shape, shape, exact=False):
        raise _refuse(where, f"mask_mod's mask {_dims(mask.shape)} does not broadcast to [B, H, Q, KV] "
                             f"{_dims(shape)}")
    return mask


def _score_hook(where: str, score_mod: _score_mod_signature, grids: tuple) -> Callable[[Tensor], Tensor]:
    """The scores ``[B, H, Q, KV]`` through ``score_mod``, which must keep their dtype and shape."""

    def modified(scores: Tensor) -> Tensor:
        out = score_mod(scores, *grids)
        if not isinstance(out, Tensor) or out.dtype != scores.dtype:
            got = f"a {out.dtype} Tensor" if isinstance(out, Tensor) else repr(out)
            raise _refuse(where, f"score_mod must return the scores as a {scores.dtype} Tensor, got {got}")
        if not _fits(out.shape, list(scores.shape), exact=True):
            raise _refuse(where, f"score_mod changed the scores' shape {_dims(scores.shape)} to {_dims(out.shape)}; "
                                 f"it must map each score to one score")
        return out

    return modified


def _lengths(where: str, B: Any, H: Any, Q_LEN: Any, KV_LEN: Any) -> list:
    """``[B, H, Q_LEN, KV_LEN]`` with None as 1; each an int >= 1 or a dim name (``x.shape[1]`` in a capture)."""
    sizes = [1 if B is None else B, 1 if H is None else H, Q_LEN, KV_LEN]
    for name, size in zip(("B", "H", "Q_LEN", "KV_LEN"), sizes):
        if not isinstance(size, str) and not (isinstance(size, (int, np.integer)) and size >= 1):
            raise _refuse(where, f"{name} must be an int >= 1 or a dim name, got {size!r}")
    return [s if isinstance(s, str) else int(s) for s in sizes]


class BlockMask:
    """A mask as ``create_block_mask`` makes it: its ``mask_mod``, the ``shape`` ``(B, H, Q_LEN, KV_LEN)``
    it was made for (B and H None as 1, broadcast over the batch and heads) and ``BLOCK_SIZE``. graphc
    computes the dense mask from ``mask_mod``; the blocks only tell torch's GPU kernel which to skip."""

    def __init__(self, mask_mod: _mask_mod_signature, shape: list, BLOCK_SIZE: tuple[int, int]):
        self.mask_mod, self.shape, self.BLOCK_SIZE = mask_mod, tuple(shape), BLOCK_SIZE

    @property
    def seq_lengths(self) -> tuple:
        """``(Q_LEN, KV_LEN)``."""
        return self.shape[2:]

    def __repr__(self) -> str:
        name = getattr(self.mask_mod, "__name__", repr(self.mask_mod))
        return f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, mask_mod={name})"


def create_block_mask(mask_mod: _mask_mod_signature, B: int | None, H: int | None, Q_LEN: Any, KV_LEN: Any,
                      device: Any = None, BLOCK_SIZE: int | tuple[int, int] = 128, _compile: bool = False,
                      separate_full_blocks: bool = True, compute_dq_write_order: bool = False,
                      dq_kv_order: bool = True) -> BlockMask:
    """torch's signature; ``_compile`` and the block-order flags tune torch's kernel and are dropped."""
    check_device("create_block_mask", device)
    if _mod_kind("create_block_mask", mask_mod) != "mask":
        raise _refuse("create_block_mask", "takes a mask_mod(b, h, q_idx, kv_idx); a score_mod goes to "
                                           "flex_attention(score_mod=)")
    blocks = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, (int, np.integer)) else tuple(BLOCK_SIZE)
    if len(blocks) != 2 or not all(isinstance(n, (int, np.integer)) and n >= 1 for n in blocks):
        raise _refuse("create_block_mask", f"BLOCK_SIZE must be an int >= 1 or two of them, got {BLOCK_SIZE!r}")
    return BlockMask(mask_mod, _lengths("create_block_mask", B, H, Q_LEN, KV_LEN), tuple(map(int, blocks)))


def create_mask(mod_fn: _mask_mod_signature | _score_mod_signature, B: int | None, H: int | None, Q_LEN: Any,
                KV_LEN: Any, device: Any = None) -> Tensor:
    """The bool mask ``[B, H, Q_LEN, KV_LEN]`` (None as 1) a mask_mod gives, or, as torch's, where a score_mod
    applied to float32 zeros does not give -inf."""
    check_device("create_mask", device)
    sizes = _lengths("create_mask", B, H, Q_LEN, KV_LEN)
    grids = _grids([arange(n) for n in sizes])
    if _mod_kind("create_mask", mod_fn) == "mask":
        return _mask("create_mask", mod_fn, grids, sizes) & full(sizes, True, "bool")
    return logical_not(isneginf(_score_hook("create_mask", mod_fn, grids)(full(sizes, 0.0, "float32"))))


def _groups(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> int:
    """How many query heads share each key/value head, after checking the inputs as torch does."""
    shapes = {"query": query.shape, "key": key.shape, "value": value.shape}
    if any(s is None or len(s) != 4 for s in shapes.values()):
        raise _refuse("flex_attention", "query, key and value must be 4-D [B, H, L, E], got " +
                      ", ".join(f"{k} {_dims(s)}" for k, s in shapes.items()))
    if len({query.dtype, key.dtype, value.dtype}) != 1:
        raise _refuse("flex_attention", f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, "
                                        f"{value.dtype}")
    (_, hq, _, eq), (bk, hk, kv, ek), (bv, hv, vv, _) = query.shape, key.shape, value.shape
    for what, a, b in (("embedding dims E of query and key", eq, ek), ("lengths of key and value", kv, vv),
                       ("batch sizes of key and value", bk, bv), ("heads of key and value", hk, hv)):
        if None not in (a, b) and a != b:
            raise _refuse("flex_attention", f"the {what} differ: {a} vs {b}")
    return head_groups("flex_attention", hq, hk, enable_gqa)


def _check_block_mask(block_mask: Any, shape: list) -> None:
    """``block_mask`` is a BlockMask made for ``shape`` ``[B, H, Q, KV]`` (its B and H may be 1)."""
    if not isinstance(block_mask, BlockMask):
        raise _refuse("flex_attention", f"block_mask must be a BlockMask from create_block_mask, got "
                                        f"{type(block_mask).__name__}")
    b, h, q, kv = block_mask.shape
    if (q, kv) != tuple(shape[2:]):
        raise _refuse("flex_attention", f"block_mask was created for Q_LEN={q}, KV_LEN={kv} but the query has "
                                        f"Q_LEN={shape[2]} and the key KV_LEN={shape[3]}; create it for these lengths")
    for name, made, want in (("B", b, shape[0]), ("H", h, shape[1])):
        if made != 1 and made != want:
            raise _refuse("flex_attention", f"block_mask was created for {name}={made} but the query has "
                                            f"{name}={want}; create it for {want} or None")


def flex_attention(query: Tensor, key: Tensor, value: Tensor, score_mod: _score_mod_signature | None = None,
                   block_mask: BlockMask | None = None, scale: float | None = None, enable_gqa: bool = False,
                   return_lse: bool = False, kernel_options: dict | None = None, *,
                   return_aux: Any = None) -> Tensor | tuple[Tensor, Tensor]:
    """``softmax(score_mod(q k^T * scale)`` where ``block_mask``'s mask_mod attends, else -inf``) v`` over
    ``[B, H, L, E]`` inputs (``scale`` None: ``1/sqrt(E)``); with ``return_lse`` also the natural-log
    logsumexp of those scores ``[B, H, Q]``. A query row with no key to attend gives zeros and a -inf
    logsumexp, as torch's. float16 and bfloat16 inputs are computed in float32, the output rounded to
    their dtype and the logsumexp kept in float32, as torch's. ``kernel_options`` tune torch's kernel
    and are dropped."""
    if return_aux is not None:
        raise _refuse("flex_attention", "return_aux is not supported; return_lse=True gives the logsumexp")
    query = ops.lift(query)
    key, value = ops.lift(key, query), ops.lift(value, query)
    groups = _groups(query, key, value, enable_gqa)
    narrow = query.dtype if query.dtype in NARROW else None
    if narrow is not None:
        query, key, value = (ops.cast(t, "float32") for t in (query, key, value))
    out = _flex(query, key, value, score_mod, block_mask, scale, groups, return_lse)
    if narrow is None:
        return out
    return (narrowed(out[0], narrow), out[1]) if return_lse else narrowed(out, narrow)


def _flex(query: Tensor, key: Tensor, value: Tensor, score_mod: _score_mod_signature | None,
          block_mask: BlockMask | None, scale: float | None, groups: int, return_lse: bool
          ) -> Tensor | tuple[Tensor, Tensor]:
    """``flex_attention`` on checked inputs of one float dtype."""
    shape = [*query.shape[:3], key.shape[2]]
    if score_mod is None and block_mask is None:
        return attend(query, key, value, scale, groups=groups, return_lse=return_lse, op="flex_attention")
    grids = _grids([dim_positions(query, 0), dim_positions(query, 1), dim_positions(query, 2),
                    dim_positions(key, 2)])
    mask = None
    if block_mask is not None:
        _check_block_mask(block_mask, shape)
        mask = _mask("flex_attention", block_mask.mask_mod, grids, shape)
    hook = None if score_mod is None else _score_hook("flex_attention", score_mod, grids)
    return attend(query, key, value, scale, attn_mask=mask, score_mod=hook, groups=groups, return_lse=return_lse,
                  op="flex_attention")
