"""A written figure is a PNG: the signature and an image header of positive size."""

import struct
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) of the PNG at ``path``; raises AssertionError if it is not one."""
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0
    return width, height
