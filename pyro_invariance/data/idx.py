"""A small reader for IDX files (the MNIST / Fashion-MNIST format), plain or gzipped.

Format (big-endian): two zero bytes, a type code byte, a dimension-count byte, then one unsigned
32-bit size per dimension, then the values in C order. Type codes: 0x08 uint8, 0x09 int8,
0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.

Anything that does not parse exactly (bad magic, unknown type, truncated data, trailing bytes,
broken gzip stream) raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

#: IDX type code -> big-endian numpy dtype.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as f:
                return f.read()
        except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError
            raise ValueError(f"corrupt IDX file {str(path)!r}: cannot decompress gzip stream ({err})") from err
    return path.read_bytes()


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (``.gz`` is decompressed) into a numpy array in native byte order.

    Returns:
        an array whose shape is the file's dimensions, e.g. ``(N, 28, 28)`` uint8 for images and
        ``(N,)`` uint8 for labels.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a well-formed IDX file (message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {str(path)!r}")
    data = _read_bytes(path)

    def bad(why: str) -> ValueError:
        return ValueError(f"corrupt IDX file {str(path)!r}: {why}")

    if len(data) < 4:
        raise bad(f"only {len(data)} bytes, shorter than the 4-byte magic number")
    zero, type_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0:
        raise bad(f"magic number 0x{data[:4].hex()} does not start with two zero bytes")
    if type_code not in IDX_DTYPES:
        raise bad(f"unknown type code 0x{type_code:02x}")
    if ndim < 1:
        raise bad("zero dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise bad(f"truncated header ({len(data)} bytes, need {header} for {ndim} dimensions)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = IDX_DTYPES[type_code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header
    if actual != expected:
        what = "truncated" if actual < expected else "trailing bytes"
        raise bad(f"{what}: dimensions {dims} need {expected} data bytes, found {actual}")
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)
