"""``gc.utils``: torch.utils' names that model code calls; ``gc.utils.checkpoint`` marks
activation-checkpoint regions (``torch.utils.checkpoint``)."""

from graphc.utils import checkpoint

__all__ = ["checkpoint"]
