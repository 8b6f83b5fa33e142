"""Half-precision conversion: a float32 model's tensors, attributes and interface as float16 or
bfloat16, with ops that must stay float32 wrapped in Casts (``graphc.compile.precision``'s pass)."""

from graphc.passes.precision.rewrite import FloatReport, RangeWarning, convert_in_place
from graphc.passes.precision.slots import DEFAULT_BLOCKED, TARGETS

__all__ = ["DEFAULT_BLOCKED", "FloatReport", "RangeWarning", "TARGETS", "convert_in_place"]
