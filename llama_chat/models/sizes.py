"""Sizes and counts as people read them."""


def human_size(count: float) -> str:
    """Bytes in the largest unit that keeps a digit before the point (1.2 GB, 845.0 MB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} bytes"


def human_parameters(count: int) -> str:
    """A parameter count: 1.24 B, 135 M."""
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.0f} M"
