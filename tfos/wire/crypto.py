"""The handshake and the record layer of tfos channels (protocol v5): pure byte functions, shared
in meaning with the node tunnel (``tfos/tunnel/rust``), which implements the same bytes; both are
pinned by the known-answer vectors in ``tests/vectors/channel-v5.json``.

Handshake (the server speaks first; every length is fixed, so nothing is allocated from a peer's
word):

* ``HELLO`` (server, 55 bytes): ``b"TFOS"``, version (u16), mode (u8: 0 clear, 1 encrypted), a
  16-byte nonce and an ephemeral X25519 public key (32 zero bytes in clear mode).
* ``AUTH`` (client, 81 bytes): its mode, its nonce, its ephemeral public key, then
  ``HMAC-SHA256(secret, "tfos-v5 client" + transcript)`` where the transcript is every byte sent so
  far (HELLO and AUTH up to the MAC). A client refuses a HELLO whose mode is not its own, and the
  server refuses an AUTH whose mode is not its own; since both modes are in the MAC'd transcript,
  nobody on the path can change either (no downgrade).
* ``FINISH`` (server, 32 bytes): ``HMAC-SHA256(secret, "tfos-v5 server" + transcript + client MAC)``.

Keys (encrypted mode): ``HKDF-SHA256(salt=secret, ikm=X25519 shared secret, info="tfos-v5 keys" +
SHA-256(transcript + client MAC + server MAC))``, 88 bytes: the client-to-server key, the
server-to-client key (AES-256), then their 12-byte IVs. The keys are new for every connection
(ephemeral keys: a secret learned later does not decrypt what was recorded before) and exist only
for a peer holding the cluster secret (the salt and the MACs).

Records (encrypted mode): ``u32 length`` (big-endian, the ciphertext's, tag included) then the
AES-256-GCM ciphertext of 0 to :data:`MAX_RECORD` plaintext bytes and its 16-byte tag. The nonce
is the direction's IV XOR the record's sequence number (0, 1, ... per direction), never sent; the
length word is the additional data. A changed, replayed, reordered, dropped or spliced record
fails its tag, so the stream is read in order or not at all. An empty record closes the stream
(the tunnel sends it before it half-closes; a stream that ends without one was cut). The
plaintext stream carries tfos frames, exactly as a clear channel does.

Primitives come from ``cryptography`` (X25519, HKDF, AES-GCM) and ``hmac``/``hashlib``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass

from tfos.errors import AuthenticationError, ProtocolError
from tfos.wire.codec import PROTOCOL_VERSION

MAGIC = b"TFOS"
VERSION = PROTOCOL_VERSION  # the handshake's and the messages' version are one
CLEAR = 0
ENCRYPTED = 1
NONCE_BYTES = 16
KEY_BYTES = 32
MAC_BYTES = 32
TAG_BYTES = 16
#: plaintext bytes per record at most: bounds what a receiver holds of a record it cannot yet check
MAX_RECORD = 1 << 20
HELLO = struct.Struct(">4sHB16s32s")
AUTH = struct.Struct(">B16s32s32s")
RECORD_HEADER = struct.Struct(">I")
_CLIENT_LABEL = b"tfos-v5 client"
_SERVER_LABEL = b"tfos-v5 server"
_KEYS_LABEL = b"tfos-v5 keys"
_NO_KEY = bytes(KEY_BYTES)
MODE_NAMES = {CLEAR: "clear", ENCRYPTED: "encrypted"}


def new_secret() -> str:
    """A fresh per-cluster secret: 32 random bytes, hex."""
    return os.urandom(KEY_BYTES).hex()


def secret_bytes(secret: str) -> bytes:
    try:
        raw = bytes.fromhex(secret)
    except ValueError:
        raise ProtocolError("the cluster secret is not hex") from None
    if len(raw) < 16:
        raise ProtocolError("the cluster secret is shorter than 16 bytes")
    return raw


def mode_of(encrypt: bool) -> int:
    return ENCRYPTED if encrypt else CLEAR


# --------------------------------------------------------------------------- handshake bytes

@dataclass(frozen=True)
class Hello:
    version: int
    mode: int
    nonce: bytes
    public: bytes


def hello(mode: int, nonce: bytes, public: bytes) -> bytes:
    return HELLO.pack(MAGIC, VERSION, mode, nonce, public if mode == ENCRYPTED else _NO_KEY)


def parse_hello(data: bytes, peer: str) -> Hello:
    """Check a server's HELLO: tfos's magic, this protocol version and a known mode."""
    magic, version, mode, nonce, public = HELLO.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"{peer} is not a tfos endpoint")
    if version != VERSION:
        raise ProtocolError(f"{peer} speaks tfos protocol v{version}, this side v{VERSION}; "
                            "install the same tfos version everywhere")
    if mode not in MODE_NAMES:
        raise ProtocolError(f"{peer} offers an unknown channel mode {mode}")
    return Hello(version, mode, nonce, public)


def client_mac(secret: bytes, transcript: bytes) -> bytes:
    return hmac.new(secret, _CLIENT_LABEL + transcript, hashlib.sha256).digest()


def server_mac(secret: bytes, transcript: bytes, client: bytes) -> bytes:
    return hmac.new(secret, _SERVER_LABEL + transcript + client, hashlib.sha256).digest()


def mode_refusal(mine: int, theirs: int, peer: str, side: str) -> ProtocolError:
    """The error for a peer whose channel mode differs from this side's."""
    return ProtocolError(f"{peer} speaks {MODE_NAMES[theirs]} tfos channels but this {side} is {MODE_NAMES[mine]}: "
                         "every process of a cluster uses the cluster's encrypt setting (reserve(encrypt=...)); "
                         "a peer of another cluster or another tfos version is refused")


@dataclass(frozen=True)
class Keys:
    """One connection's record keys."""

    client_key: bytes
    server_key: bytes
    client_iv: bytes
    server_iv: bytes


def derive_keys(secret: bytes, shared: bytes, transcript: bytes, client: bytes, server: bytes) -> Keys:
    """The record keys of one connection (module notes). ``shared``: the X25519 shared secret."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if shared == bytes(len(shared)):
        raise AuthenticationError("the peer's key exchange gave an all-zero secret")
    info = _KEYS_LABEL + hashlib.sha256(transcript + client + server).digest()
    okm = HKDF(algorithm=hashes.SHA256(), length=88, salt=secret, info=info).derive(shared)
    return Keys(okm[0:32], okm[32:64], okm[64:76], okm[76:88])


class Ephemeral:
    """One side's X25519 key pair for one connection (``private`` for known-answer tests)."""

    def __init__(self, private: bytes | None = None):
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        self._key = X25519PrivateKey.from_private_bytes(private) if private else X25519PrivateKey.generate()
        from cryptography.hazmat.primitives import serialization as s

        self.public = self._key.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)

    def shared(self, peer_public: bytes) -> bytes:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

        try:
            return self._key.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError as e:  # a low-order point: no shared secret
            raise AuthenticationError(f"the peer's key exchange failed: {e}") from None


# --------------------------------------------------------------------------- records

def _nonce(iv: bytes, seq: int) -> bytes:
    return (int.from_bytes(iv, "big") ^ seq).to_bytes(12, "big")


class Sealer:
    """One direction's sending half: turns plaintext into records, in order."""

    def __init__(self, key: bytes, iv: bytes):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)
        self._iv = iv
        self.seq = 0

    def seal_into(self, plain, out: memoryview) -> int:
        """Write one record of ``plain`` (at most MAX_RECORD bytes, any buffer) at the start of
        ``out``; returns its size (``len(plain)`` + 20). ``plain`` may be ``out[4:4 + n]`` itself:
        the record is then sealed in place."""
        n = memoryview(plain).nbytes
        if n > MAX_RECORD:
            raise ProtocolError(f"a record holds at most {MAX_RECORD} bytes, not {n}")
        header = RECORD_HEADER.pack(n + TAG_BYTES)
        out[:4] = header
        self._aead.encrypt_into(_nonce(self._iv, self.seq), plain, header, out[4:4 + n + TAG_BYTES])
        self.seq += 1
        return n + TAG_BYTES + 4

    def seal(self, plain) -> bytes:
        """One record of ``plain`` as new bytes."""
        n = memoryview(plain).nbytes
        out = bytearray(n + TAG_BYTES + 4)
        self.seal_into(plain, memoryview(out))
        return bytes(out)


def record_length(header: bytes, peer: str) -> int:
    """The ciphertext length a record header announces, checked before anything is allocated."""
    (length,) = RECORD_HEADER.unpack(header)
    if length < TAG_BYTES or length > MAX_RECORD + TAG_BYTES:
        raise ProtocolError(f"record of {length} bytes from {peer} is outside 16..{MAX_RECORD + TAG_BYTES}")
    return length


class Opener:
    """One direction's receiving half: checks and decrypts records in order."""

    def __init__(self, key: bytes, iv: bytes):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)
        self._iv = iv
        self.seq = 0

    def open_in_place(self, header: bytes, body: memoryview, peer: str) -> int:
        """Check and decrypt the record whose ``header`` was read and whose ciphertext and tag fill
        ``body``; the plaintext replaces the ciphertext's first bytes. Returns its length.
        ProtocolError if the record was changed, replayed, reordered or comes from another
        connection."""
        from cryptography.exceptions import InvalidTag

        n = body.nbytes - TAG_BYTES
        try:
            self._aead.decrypt_into(_nonce(self._iv, self.seq), body, header, body[:n])
        except InvalidTag:
            raise ProtocolError(f"record {self.seq} from {peer} failed its integrity check (changed, replayed, "
                                "reordered or from another connection); the connection is closed") from None
        self.seq += 1
        return n
