"""TFRecord files: framing with masked CRC-32C, compression, and reading/writing records.

Runs in the Spark tasks of :func:`~tfos.data.save_as_tfrecords` / :func:`~tfos.data.load_tfrecords`
and in the TF process (the arrow reader of :func:`~tfos.data.tfrecord_dataset`). CRC-32C comes
from ``google_crc32c`` (C); TensorFlow is imported only by the ``engine='tensorflow'`` writer.

A record is framed as: length (uint64 LE), masked CRC-32C of the length (uint32 LE), data, masked
CRC-32C of the data (uint32 LE), where ``masked(c) = rotr15(c) + 0xA282EAD8``.
"""

from __future__ import annotations

import gzip
import os
import struct
import tempfile
import zlib
from collections.abc import Iterable, Iterator

import google_crc32c

from tfos.data.fs import _resolve
from tfos.errors import ConfigError, FeedError


def _masked_crc(data: bytes) -> int:
    c = google_crc32c.value(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(record: bytes) -> bytes:
    """One record in TFRecord framing: length, masked CRC-32C of the length, data, masked CRC of data."""
    record = bytes(record)
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", _masked_crc(header)) + record + struct.pack("<I", _masked_crc(record))


def iter_tfrecords(stream, verify_checksums="auto", source: str = "", block_size: int = 4 << 20) -> Iterator[bytes]:
    """Yield the records of an (uncompressed) TFRecord byte stream (anything with ``read(n)``).

    The stream is read in blocks of ``block_size`` bytes and the records are cut out of each block
    (one ``read`` per block, not two per record). The length checksum is always checked; data
    checksums too unless ``verify_checksums`` is false (``'auto'``, the default, checks them:
    CRC-32C runs in C). Raises :class:`~tfos.errors.FeedError` on corruption.
    """
    verify = verify_checksums == "auto" or bool(verify_checksums)
    where = f" in {source}" if source else ""
    buf, pos = b"", 0

    def refill(need: int, what: str) -> bool:
        """Make ``need`` bytes available from ``pos``; False at a clean end of stream."""
        nonlocal buf, pos
        while len(buf) - pos < need:
            block = stream.read(max(block_size, need - (len(buf) - pos)))
            if not block:
                if what == "header" and len(buf) == pos:
                    return False
                raise FeedError(f"truncated TFRecord {what}: expected {need} bytes, got {len(buf) - pos}; the file "
                                "is incomplete or not a TFRecord file (wrong compression_type?)")
            buf, pos = buf[pos:] + bytes(block), 0
        return True

    while refill(12, "header"):
        (length,) = _LENGTH.unpack_from(buf, pos)
        (length_crc,) = _CRC.unpack_from(buf, pos + 8)
        if length_crc != _masked_crc(buf[pos:pos + 8]):
            raise FeedError(f"corrupt TFRecord length checksum{where}: the file is damaged, compressed "
                            "(pass compression_type='GZIP' or 'ZLIB'), or not a TFRecord file")
        refill(12 + length + 4, "record")
        start = pos + 12
        record = buf[start:start + length]
        if verify and _CRC.unpack_from(buf, start + length)[0] != _masked_crc(record):
            raise FeedError(f"corrupt TFRecord data checksum{where}: the file is damaged")
        pos = start + length + 4
        yield record


_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


# --------------------------------------------------------------------------- compression

class _ZlibReader:
    """``read(n)`` over a zlib-compressed stream (TFRecord compression_type 'ZLIB')."""

    def __init__(self, raw):
        self._raw = raw
        self._z = zlib.decompressobj()
        self._buf = b""
        self._eof = False

    def read(self, n: int) -> bytes:
        while len(self._buf) < n and not self._eof:
            chunk = self._raw.read(1 << 20)
            if not chunk:
                self._buf += self._z.flush()
                self._eof = True
            else:
                self._buf += self._z.decompress(bytes(chunk))
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _norm_compression(compression) -> str:
    c = (compression or "").upper()
    if c in ("", "NONE"):
        return ""
    if c in ("GZIP", "GZ"):
        return "GZIP"
    if c == "ZLIB":
        return "ZLIB"
    raise ConfigError(f"compression_type must be None, 'GZIP' or 'ZLIB' (or 'auto' when reading), got {compression!r}")


def _compression_of(name: str) -> str:
    lower = name.lower()
    if lower.endswith((".gz", ".gzip")):
        return "GZIP"
    if lower.endswith((".zlib", ".zz")):
        return "ZLIB"
    return ""


def _decompressing(raw, compression: str):
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "ZLIB":
        return _ZlibReader(raw)
    return raw


# --------------------------------------------------------------------------- files

def _iter_file_records(uri: str, compression: str, verify) -> Iterator[bytes]:
    """The records of one TFRecord file; ``compression`` may be ``'auto'`` (by extension)."""
    fs, path, _ = _resolve(uri)
    comp = _compression_of(path) if compression == "auto" else compression
    with fs.open_input_stream(path, compression=None, buffer_size=1 << 20) as raw:
        yield from iter_tfrecords(_decompressing(raw, comp), verify, source=uri)


def _write_records_python(out, records: Iterable[bytes], compression: str) -> int:
    """Frame ``records`` into the binary stream ``out`` (compressing if asked); returns the count."""
    z = None
    if compression == "GZIP":
        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    elif compression == "ZLIB":
        z = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    buf = bytearray()
    count = 0

    def flush():
        data = bytes(buf)
        buf.clear()
        if z is not None:
            data = z.compress(data)
        if data:
            out.write(data)

    for record in records:
        buf += tfrecord_frame(record)
        count += 1
        if len(buf) >= 1 << 20:
            flush()
    flush()
    if z is not None:
        out.write(z.flush())
    return count


def _write_records_tensorflow(local_path: str, records: Iterable[bytes], compression: str) -> int:
    import tensorflow as tf

    count = 0
    with tf.io.TFRecordWriter(local_path, tf.io.TFRecordOptions(compression_type=compression)) as w:
        for record in records:
            w.write(record)
            count += 1
    return count


def _choose_engine(engine: str) -> str:
    """``'auto'`` is ``'python'``: framing with the C CRC-32C needs no TensorFlow."""
    if engine not in ("auto", "python", "tensorflow"):
        raise ConfigError(f"engine must be 'auto', 'python' or 'tensorflow', got {engine!r}")
    return "python" if engine == "auto" else engine


def _write_tfrecord_file(fs, path: str, records: Iterable[bytes], compression: str, engine: str) -> int:
    """Write a TFRecord file at ``path`` on pyarrow filesystem ``fs``; returns the record count."""
    from pyarrow import fs as pafs

    if _choose_engine(engine) == "python":
        with fs.open_output_stream(path, compression=None) as out:
            return _write_records_python(out, records, compression)
    if isinstance(fs, pafs.LocalFileSystem):
        return _write_records_tensorflow(path, records, compression)
    fd, local = tempfile.mkstemp(prefix="tfos-", suffix=".tfrecord")
    os.close(fd)
    try:
        count = _write_records_tensorflow(local, records, compression)
        pafs.copy_files(local, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    finally:
        os.remove(local)
    return count
