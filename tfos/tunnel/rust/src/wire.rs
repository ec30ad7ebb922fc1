//! tfos protocol v5 as the tunnel speaks it: the handshake's bytes, the key schedule, the record
//! layer and the few JSON frames a tunnel exchanges. The reference is the Python side
//! (`tfos/wire/crypto.py`, `tfos/wire/channel.py`); both are pinned by the known-answer vectors in
//! `tests/vectors/channel-v5.json`, which this module's tests load.
//!
//! The pure functions (`hello`, `client_auth`, `server_auth`, `client_finish`, `derive_keys`,
//! [`Sealer`], [`Opener`], the frame codecs) take every random input as an argument so that the
//! vectors can drive them; [`client_handshake`] and [`server_handshake`] wrap them around a socket
//! in encrypted mode, the only mode a tunnel speaks.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use ring::rand::SecureRandom;
use ring::{aead, digest, hkdf, hmac};
use x25519_dalek::{PublicKey, StaticSecret};

pub const MAGIC: [u8; 4] = *b"TFOS";
pub const VERSION: u16 = 5;
pub const CLEAR: u8 = 0;
pub const ENCRYPTED: u8 = 1;
pub const NONCE_LEN: usize = 16;
pub const KEY_LEN: usize = 32;
pub const MAC_LEN: usize = 32;
pub const TAG_LEN: usize = 16;
pub const IV_LEN: usize = 12;
/// HELLO: magic, version (u16), mode, nonce, X25519 public key.
pub const HELLO_LEN: usize = 4 + 2 + 1 + NONCE_LEN + KEY_LEN;
/// AUTH: mode, nonce, X25519 public key, client MAC.
pub const AUTH_LEN: usize = 1 + NONCE_LEN + KEY_LEN + MAC_LEN;
/// Plaintext bytes per record at most.
pub const MAX_RECORD: usize = 1 << 20;
/// Record header: the ciphertext's length (tag included), u32 big-endian.
pub const RECORD_HEADER_LEN: usize = 4;
/// Frame header: kind byte, u32 big-endian payload length.
pub const FRAME_HEADER_LEN: usize = 5;
pub const KIND_JSON: u8 = b'J';
/// The largest JSON frame a tunnel accepts (its messages are a few dozen bytes).
pub const MAX_JSON_FRAME: usize = 64 * 1024;

const CLIENT_LABEL: &[u8] = b"tfos-v5 client";
const SERVER_LABEL: &[u8] = b"tfos-v5 server";
const KEYS_LABEL: &[u8] = b"tfos-v5 keys";

/// What went wrong on a tfos connection.
#[derive(Debug)]
pub enum Error {
    /// The peer does not hold the cluster secret, or its key exchange is unusable.
    Auth(String),
    /// The peer sent bytes that break the protocol (or a record that fails its check).
    Protocol(String),
    /// The connection ended where it must not.
    Closed(String),
    /// A deadline passed.
    Timeout(String),
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Auth(m) | Error::Protocol(m) | Error::Closed(m) | Error::Timeout(m) => f.write_str(m),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout(format!("timed out ({e})")),
            _ => Error::Io(e),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// `n` random bytes from the system's generator.
pub fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| Error::Io(io::Error::other("the system random generator failed")))?;
    Ok(out)
}

fn mode_name(mode: u8) -> &'static str {
    if mode == ENCRYPTED {
        "encrypted"
    } else {
        "clear"
    }
}

// ------------------------------------------------------------------------------ key exchange

/// One side's X25519 key pair for one connection.
pub struct Ephemeral {
    secret: StaticSecret,
    pub public: [u8; KEY_LEN],
}

impl Ephemeral {
    /// A key pair from fixed private bytes (the known-answer tests).
    pub fn from_private(private: [u8; KEY_LEN]) -> Self {
        let secret = StaticSecret::from(private);
        let public = PublicKey::from(&secret).to_bytes();
        Ephemeral { secret, public }
    }

    /// A fresh key pair.
    pub fn generate() -> Result<Self> {
        Ok(Self::from_private(random()?))
    }

    /// The shared secret with the peer's public key; refused when it is all zeros (a low-order
    /// point: no secret at all).
    pub fn shared(&self, peer_public: &[u8; KEY_LEN]) -> Result<[u8; KEY_LEN]> {
        let shared = self.secret.diffie_hellman(&PublicKey::from(*peer_public)).to_bytes();
        if shared == [0u8; KEY_LEN] {
            return Err(Error::Auth("the peer's key exchange gave an all-zero secret".into()));
        }
        Ok(shared)
    }
}

// ------------------------------------------------------------------------------ handshake bytes

/// A server's HELLO.
pub fn hello(mode: u8, nonce: &[u8; NONCE_LEN], public: &[u8; KEY_LEN]) -> [u8; HELLO_LEN] {
    let mut out = [0u8; HELLO_LEN];
    out[0..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&VERSION.to_be_bytes());
    out[6] = mode;
    out[7..23].copy_from_slice(nonce);
    if mode == ENCRYPTED {
        out[23..55].copy_from_slice(public);
    }
    out
}

/// A HELLO's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub mode: u8,
    pub nonce: [u8; NONCE_LEN],
    pub public: [u8; KEY_LEN],
}

/// Check a server's HELLO: tfos's magic, this protocol version and a known mode.
pub fn parse_hello(data: &[u8; HELLO_LEN], peer: &str) -> Result<Hello> {
    if data[0..4] != MAGIC {
        return Err(Error::Protocol(format!("{peer} is not a tfos endpoint")));
    }
    let version = u16::from_be_bytes([data[4], data[5]]);
    if version != VERSION {
        return Err(Error::Protocol(format!(
            "{peer} speaks tfos protocol v{version}, this side v{VERSION}; install the same tfos version everywhere"
        )));
    }
    let mode = data[6];
    if mode != CLEAR && mode != ENCRYPTED {
        return Err(Error::Protocol(format!("{peer} offers an unknown channel mode {mode}")));
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&data[7..23]);
    let mut public = [0u8; KEY_LEN];
    public.copy_from_slice(&data[23..55]);
    Ok(Hello { mode, nonce, public })
}

fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut ctx = hmac::Context::with_key(&key);
    for p in parts {
        ctx.update(p);
    }
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

/// `HMAC-SHA256(secret, "tfos-v5 client" + transcript)`.
pub fn client_mac(secret: &[u8], transcript: &[u8]) -> [u8; MAC_LEN] {
    mac(secret, &[CLIENT_LABEL, transcript])
}

/// `HMAC-SHA256(secret, "tfos-v5 server" + transcript + client MAC)`.
pub fn server_mac(secret: &[u8], transcript: &[u8], client: &[u8]) -> [u8; MAC_LEN] {
    mac(secret, &[SERVER_LABEL, transcript, client])
}

/// Check `tag` against the MAC of `parts` in constant time.
fn mac_matches(secret: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::verify(&key, &parts.concat(), tag).is_ok()
}

/// One connection's record keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub client_key: [u8; KEY_LEN],
    pub server_key: [u8; KEY_LEN],
    pub client_iv: [u8; IV_LEN],
    pub server_iv: [u8; IV_LEN],
}

struct OkmLen(usize);

impl hkdf::KeyType for OkmLen {
    fn len(&self) -> usize {
        self.0
    }
}

/// `HKDF-SHA256(salt=secret, ikm=shared, info="tfos-v5 keys" + SHA-256(transcript + client MAC +
/// server MAC))`, 88 bytes: client key, server key, client IV, server IV.
pub fn derive_keys(
    secret: &[u8],
    shared: &[u8; KEY_LEN],
    transcript: &[u8],
    client: &[u8],
    server: &[u8],
) -> Result<Keys> {
    if *shared == [0u8; KEY_LEN] {
        return Err(Error::Auth("the peer's key exchange gave an all-zero secret".into()));
    }
    let mut h = digest::Context::new(&digest::SHA256);
    h.update(transcript);
    h.update(client);
    h.update(server);
    let h = h.finish();
    let info = [KEYS_LABEL, h.as_ref()];
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, secret).extract(shared);
    let mut okm = [0u8; 88];
    prk.expand(&info, OkmLen(okm.len()))
        .and_then(|o| o.fill(&mut okm))
        .map_err(|_| Error::Protocol("key derivation failed".into()))?;
    let mut keys =
        Keys { client_key: [0; KEY_LEN], server_key: [0; KEY_LEN], client_iv: [0; IV_LEN], server_iv: [0; IV_LEN] };
    keys.client_key.copy_from_slice(&okm[0..32]);
    keys.server_key.copy_from_slice(&okm[32..64]);
    keys.client_iv.copy_from_slice(&okm[64..76]);
    keys.server_iv.copy_from_slice(&okm[76..88]);
    Ok(keys)
}

fn mode_refusal(mine: u8, theirs: u8, peer: &str, side: &str) -> Error {
    Error::Protocol(format!("{peer} speaks {} tfos channels but this {side} is {}", mode_name(theirs), mode_name(mine)))
}

/// What a client keeps between its AUTH and the server's FINISH.
pub struct ClientPending {
    transcript: Vec<u8>,
    mac: [u8; MAC_LEN],
    server_public: [u8; KEY_LEN],
}

/// The client's answer to `hello_bytes`: its AUTH, and what it needs to check the FINISH. In
/// encrypted mode `ephemeral` is required.
pub fn client_auth(
    secret: &[u8],
    mode: u8,
    hello_bytes: &[u8; HELLO_LEN],
    nonce: &[u8; NONCE_LEN],
    ephemeral: Option<&Ephemeral>,
    peer: &str,
) -> Result<([u8; AUTH_LEN], ClientPending)> {
    let server = parse_hello(hello_bytes, peer)?;
    if server.mode != mode {
        return Err(mode_refusal(mode, server.mode, peer, "client"));
    }
    let public = match (mode, ephemeral) {
        (ENCRYPTED, Some(e)) => e.public,
        (ENCRYPTED, None) => return Err(Error::Protocol("an encrypted handshake needs a key pair".into())),
        _ => [0u8; KEY_LEN],
    };
    let mut transcript = Vec::with_capacity(HELLO_LEN + AUTH_LEN - MAC_LEN);
    transcript.extend_from_slice(hello_bytes);
    transcript.push(mode);
    transcript.extend_from_slice(nonce);
    transcript.extend_from_slice(&public);
    let mac = client_mac(secret, &transcript);
    let mut auth = [0u8; AUTH_LEN];
    auth[..AUTH_LEN - MAC_LEN].copy_from_slice(&transcript[HELLO_LEN..]);
    auth[AUTH_LEN - MAC_LEN..].copy_from_slice(&mac);
    Ok((auth, ClientPending { transcript, mac, server_public: server.public }))
}

/// Check the server's FINISH; in encrypted mode, the connection's keys.
pub fn client_finish(
    secret: &[u8],
    pending: &ClientPending,
    finish: &[u8; MAC_LEN],
    ephemeral: Option<&Ephemeral>,
    peer: &str,
) -> Result<Option<Keys>> {
    if !mac_matches(secret, &[SERVER_LABEL, &pending.transcript, &pending.mac], finish) {
        return Err(Error::Auth(format!("{peer} failed to prove it holds the cluster secret")));
    }
    match ephemeral {
        Some(e) => {
            let shared = e.shared(&pending.server_public)?;
            derive_keys(secret, &shared, &pending.transcript, &pending.mac, finish).map(Some)
        }
        None => Ok(None),
    }
}

/// The server's check of a client's AUTH (answering `hello_bytes`, which it sent): its FINISH
/// and, in encrypted mode, the connection's keys (derived before the answer, so that a bad key
/// share fails here).
pub fn server_auth(
    secret: &[u8],
    mode: u8,
    hello_bytes: &[u8; HELLO_LEN],
    auth: &[u8; AUTH_LEN],
    ephemeral: Option<&Ephemeral>,
    peer: &str,
) -> Result<([u8; MAC_LEN], Option<Keys>)> {
    let client_mode = auth[0];
    if client_mode != CLEAR && client_mode != ENCRYPTED {
        return Err(Error::Protocol(format!("connection from {peer} sent a malformed handshake")));
    }
    if client_mode != mode {
        return Err(mode_refusal(mode, client_mode, &format!("connection from {peer}"), "listener"));
    }
    let mut transcript = Vec::with_capacity(HELLO_LEN + AUTH_LEN - MAC_LEN);
    transcript.extend_from_slice(hello_bytes);
    transcript.extend_from_slice(&auth[..AUTH_LEN - MAC_LEN]);
    let mac = &auth[AUTH_LEN - MAC_LEN..];
    if !mac_matches(secret, &[CLIENT_LABEL, &transcript], mac) {
        return Err(Error::Auth(format!("connection from {peer} failed authentication")));
    }
    let answer = server_mac(secret, &transcript, mac);
    let keys = match (mode, ephemeral) {
        (ENCRYPTED, Some(e)) => {
            let mut public = [0u8; KEY_LEN];
            public.copy_from_slice(&auth[17..49]);
            let shared = e.shared(&public)?;
            Some(derive_keys(secret, &shared, &transcript, mac, &answer)?)
        }
        (ENCRYPTED, None) => return Err(Error::Protocol("an encrypted handshake needs a key pair".into())),
        _ => None,
    };
    Ok((answer, keys))
}

// ------------------------------------------------------------------------------ records

fn record_nonce(iv: &[u8; IV_LEN], seq: u64) -> aead::Nonce {
    let mut n = *iv;
    for (b, s) in n[IV_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    aead::Nonce::assume_unique_for_key(n)
}

fn aes_key(key: &[u8; KEY_LEN]) -> aead::LessSafeKey {
    // A 32-byte key is always a valid AES-256 key.
    aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_256_GCM, key).expect("AES-256 takes a 32-byte key"))
}

/// The ciphertext length a record header announces, checked before anything is allocated.
pub fn record_length(header: [u8; RECORD_HEADER_LEN]) -> Result<usize> {
    let n = u32::from_be_bytes(header) as usize;
    if !(TAG_LEN..=MAX_RECORD + TAG_LEN).contains(&n) {
        return Err(Error::Protocol(format!("record of {n} bytes is outside {TAG_LEN}..{}", MAX_RECORD + TAG_LEN)));
    }
    Ok(n)
}

/// One direction's sending half.
pub struct Sealer {
    key: aead::LessSafeKey,
    iv: [u8; IV_LEN],
    pub seq: u64,
}

impl Sealer {
    pub fn new(key: &[u8; KEY_LEN], iv: &[u8; IV_LEN]) -> Self {
        Sealer { key: aes_key(key), iv: *iv, seq: 0 }
    }

    /// Seal the `n` plaintext bytes at `rec[4..4 + n]` in place: writes the header before them and
    /// the tag after them; returns the record's size, `n + 20`.
    pub fn seal(&mut self, rec: &mut [u8], n: usize) -> Result<usize> {
        let size = RECORD_HEADER_LEN + n + TAG_LEN;
        if n > MAX_RECORD || rec.len() < size {
            return Err(Error::Protocol(format!("cannot seal {n} bytes into a {}-byte buffer", rec.len())));
        }
        let header = ((n + TAG_LEN) as u32).to_be_bytes();
        rec[..RECORD_HEADER_LEN].copy_from_slice(&header);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                record_nonce(&self.iv, self.seq),
                aead::Aad::from(header),
                &mut rec[RECORD_HEADER_LEN..RECORD_HEADER_LEN + n],
            )
            .map_err(|_| Error::Protocol("sealing failed".into()))?;
        rec[RECORD_HEADER_LEN + n..size].copy_from_slice(tag.as_ref());
        self.seq += 1;
        Ok(size)
    }

    /// One record of `plain` as new bytes.
    pub fn seal_to_vec(&mut self, plain: &[u8]) -> Result<Vec<u8>> {
        let mut rec = vec![0u8; plain.len() + RECORD_HEADER_LEN + TAG_LEN];
        rec[RECORD_HEADER_LEN..RECORD_HEADER_LEN + plain.len()].copy_from_slice(plain);
        self.seal(&mut rec, plain.len())?;
        Ok(rec)
    }
}

/// One direction's receiving half.
pub struct Opener {
    key: aead::LessSafeKey,
    iv: [u8; IV_LEN],
    pub seq: u64,
}

impl Opener {
    pub fn new(key: &[u8; KEY_LEN], iv: &[u8; IV_LEN]) -> Self {
        Opener { key: aes_key(key), iv: *iv, seq: 0 }
    }

    /// Check and decrypt, in place, the record whose header is `header` and whose ciphertext and
    /// tag fill `body`; returns the plaintext's length (it starts at `body[0]`).
    pub fn open(&mut self, header: [u8; RECORD_HEADER_LEN], body: &mut [u8]) -> Result<usize> {
        let seq = self.seq;
        let plain =
            self.key.open_in_place(record_nonce(&self.iv, seq), aead::Aad::from(header), body).map_err(|_| {
                Error::Protocol(format!(
                    "record {seq} failed its integrity check (changed, replayed, reordered or from another connection)"
                ))
            })?;
        let n = plain.len();
        self.seq += 1;
        Ok(n)
    }
}

// ------------------------------------------------------------------------------ frames and messages

/// One JSON frame: kind `J`, u32 big-endian length, payload.
pub fn json_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    out.push(KIND_JSON);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload length a frame header announces: JSON frames only, at most [`MAX_JSON_FRAME`].
pub fn frame_length(header: [u8; FRAME_HEADER_LEN]) -> Result<usize> {
    if header[0] != KIND_JSON {
        return Err(Error::Protocol(format!("unexpected frame kind {:?}", header[0] as char)));
    }
    let n = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if n > MAX_JSON_FRAME {
        return Err(Error::Protocol(format!("JSON frame of {n} bytes exceeds the tunnel's limit of {MAX_JSON_FRAME}")));
    }
    Ok(n)
}

/// A string as JSON, as Python's `json.dumps` writes it (ASCII only, `\uXXXX` escapes).
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", u));
                }
            }
        }
    }
    out.push('"');
    out
}

/// The messages a tunnel exchanges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    TunnelOpen { port: u16 },
    Ack,
    ErrorReply { message: String },
}

impl Message {
    /// The message's JSON, as Python's codec writes it (fields, then `type`, then `v`).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Message::TunnelOpen { port } => format!("{{\"port\":{port},\"type\":\"TunnelOpen\",\"v\":5}}").into_bytes(),
            Message::Ack => b"{\"type\":\"Ack\",\"v\":5}".to_vec(),
            Message::ErrorReply { message } => {
                format!("{{\"message\":{},\"type\":\"ErrorReply\",\"v\":5}}", json_string(message)).into_bytes()
            }
        }
    }

    /// The message as one frame.
    pub fn frame(&self) -> Vec<u8> {
        json_frame(&self.encode())
    }
}

/// Parse one JSON frame's payload (keys in any order, unknown keys ignored).
pub fn parse_message(payload: &[u8]) -> Result<Message> {
    let value: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| Error::Protocol(format!("frame is not valid JSON: {e}")))?;
    let obj = value.as_object().ok_or_else(|| Error::Protocol("frame is not a JSON object".into()))?;
    if obj.get("v").and_then(|v| v.as_u64()) != Some(u64::from(VERSION)) {
        return Err(Error::Protocol(format!(
            "message version mismatch (this side speaks v{VERSION}); install the same tfos version everywhere"
        )));
    }
    match obj.get("type").and_then(|t| t.as_str()) {
        Some("TunnelOpen") => {
            let port = obj.get("port").and_then(|p| p.as_u64()).unwrap_or(0);
            if !(1..=65535).contains(&port) {
                return Err(Error::Protocol("TunnelOpen.port: expected a port number 1..65535".into()));
            }
            Ok(Message::TunnelOpen { port: port as u16 })
        }
        Some("Ack") => Ok(Message::Ack),
        Some("ErrorReply") => match obj.get("message").and_then(|m| m.as_str()) {
            Some(m) => Ok(Message::ErrorReply { message: m.to_string() }),
            None => Err(Error::Protocol("ErrorReply.message: expected a string".into())),
        },
        Some(other) => {
            let shown: String = other.chars().take(64).collect();
            Err(Error::Protocol(format!("unexpected message type {}", json_string(&shown))))
        }
        None => Err(Error::Protocol("unknown message type".into())),
    }
}

// ------------------------------------------------------------------------------ socket I/O

fn set_timeout(sock: &TcpStream, deadline: Option<Instant>, write: bool) -> Result<()> {
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout("the handshake deadline passed".into()));
        }
        if write {
            sock.set_write_timeout(Some(left))?;
        } else {
            sock.set_read_timeout(Some(left))?;
        }
    }
    Ok(())
}

/// Fill `buf` from `sock`; returns how many bytes came before the end of the stream (less than
/// `buf.len()` only when the peer closed). With a deadline, every wait is bounded by it.
pub fn read_full(sock: &TcpStream, buf: &mut [u8], deadline: Option<Instant>) -> Result<usize> {
    let mut got = 0;
    let mut reader = sock;
    while got < buf.len() {
        set_timeout(sock, deadline, false)?;
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

/// Write all of `data` to `sock`, every wait bounded by the deadline if there is one.
pub fn write_full(sock: &TcpStream, data: &[u8], deadline: Option<Instant>) -> Result<()> {
    let mut writer = sock;
    let mut sent = 0;
    while sent < data.len() {
        set_timeout(sock, deadline, true)?;
        match writer.write(&data[sent..]) {
            Ok(0) => return Err(Error::Closed("the connection closed while sending".into())),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The sending half of an encrypted connection.
pub struct RecordWriter {
    pub sealer: Sealer,
}

impl RecordWriter {
    /// Send `data` as records of at most [`MAX_RECORD`] bytes.
    pub fn send(&mut self, sock: &TcpStream, data: &[u8], deadline: Option<Instant>) -> Result<()> {
        for chunk in data.chunks(MAX_RECORD) {
            let rec = self.sealer.seal_to_vec(chunk)?;
            write_full(sock, &rec, deadline)?;
        }
        Ok(())
    }

    /// Send one message as one record.
    pub fn send_message(&mut self, sock: &TcpStream, msg: &Message, deadline: Option<Instant>) -> Result<()> {
        self.send(sock, &msg.frame(), deadline)
    }

    /// Send close_notify: the end of this direction's stream.
    pub fn close_notify(&mut self, sock: &TcpStream, deadline: Option<Instant>) -> Result<()> {
        let rec = self.sealer.seal_to_vec(&[])?;
        write_full(sock, &rec, deadline)
    }
}

/// The receiving half of an encrypted connection: records are opened in a reused buffer; the
/// plaintext not yet consumed is `pending()`.
pub struct RecordReader {
    opener: Opener,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RecordReader {
    pub fn new(opener: Opener) -> Self {
        RecordReader { opener, buf: Vec::new(), start: 0, end: 0 }
    }

    /// Plaintext received and not yet consumed.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// Read, check and open the next record (its plaintext becomes `pending()`, replacing what
    /// was there). `Ok(false)` on close_notify. A stream that ends without close_notify, or
    /// inside a record, is [`Error::Closed`].
    pub fn next_record(&mut self, sock: &TcpStream, deadline: Option<Instant>) -> Result<bool> {
        let mut header = [0u8; RECORD_HEADER_LEN];
        match read_full(sock, &mut header, deadline)? {
            RECORD_HEADER_LEN => {}
            0 => return Err(Error::Closed("the stream ended without close_notify (cut)".into())),
            _ => return Err(Error::Closed("the stream ended inside a record (cut)".into())),
        }
        let len = record_length(header)?;
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        if read_full(sock, &mut self.buf[..len], deadline)? < len {
            return Err(Error::Closed("the stream ended inside a record (cut)".into()));
        }
        let n = self.opener.open(header, &mut self.buf[..len])?;
        self.start = 0;
        self.end = n;
        Ok(n > 0)
    }

    /// Exactly `out.len()` bytes of the plaintext stream.
    pub fn read_exact(&mut self, sock: &TcpStream, out: &mut [u8], deadline: Option<Instant>) -> Result<()> {
        let mut got = 0;
        while got < out.len() {
            if self.start == self.end && !self.next_record(sock, deadline)? {
                return Err(Error::Closed("the peer closed the stream before a whole message".into()));
            }
            let k = (out.len() - got).min(self.end - self.start);
            out[got..got + k].copy_from_slice(&self.buf[self.start..self.start + k]);
            self.start += k;
            got += k;
        }
        Ok(())
    }

    /// The next message of the plaintext stream.
    pub fn read_message(&mut self, sock: &TcpStream, deadline: Option<Instant>) -> Result<Message> {
        let mut header = [0u8; FRAME_HEADER_LEN];
        self.read_exact(sock, &mut header, deadline)?;
        let mut payload = vec![0u8; frame_length(header)?];
        self.read_exact(sock, &mut payload, deadline)?;
        parse_message(&payload)
    }
}

/// An encrypted connection after its handshake.
pub struct Session {
    pub writer: RecordWriter,
    pub reader: RecordReader,
}

impl Session {
    fn new(tx: (&[u8; KEY_LEN], &[u8; IV_LEN]), rx: (&[u8; KEY_LEN], &[u8; IV_LEN])) -> Self {
        Session {
            writer: RecordWriter { sealer: Sealer::new(tx.0, tx.1) },
            reader: RecordReader::new(Opener::new(rx.0, rx.1)),
        }
    }

    /// The client's session with `keys`.
    pub fn client(keys: &Keys) -> Self {
        Session::new((&keys.client_key, &keys.client_iv), (&keys.server_key, &keys.server_iv))
    }

    /// The server's session with `keys`.
    pub fn server(keys: &Keys) -> Self {
        Session::new((&keys.server_key, &keys.server_iv), (&keys.client_key, &keys.client_iv))
    }
}

/// The client's side of an encrypted handshake on `sock`, within `deadline`.
pub fn client_handshake(sock: &TcpStream, secret: &[u8], deadline: Instant, peer: &str) -> Result<Session> {
    let mut raw_hello = [0u8; HELLO_LEN];
    if read_full(sock, &mut raw_hello, Some(deadline))? < HELLO_LEN {
        return Err(Error::Auth(format!("{peer} closed the connection during the handshake")));
    }
    let mine = Ephemeral::generate()?;
    let nonce = random::<NONCE_LEN>()?;
    let (auth, pending) = client_auth(secret, ENCRYPTED, &raw_hello, &nonce, Some(&mine), peer)?;
    write_full(sock, &auth, Some(deadline))?;
    let mut finish = [0u8; MAC_LEN];
    if read_full(sock, &mut finish, Some(deadline))? < MAC_LEN {
        return Err(Error::Auth(format!("{peer} rejected this connection: wrong cluster secret")));
    }
    let keys = client_finish(secret, &pending, &finish, Some(&mine), peer)?
        .ok_or_else(|| Error::Protocol("no keys from an encrypted handshake".into()))?;
    Ok(Session::client(&keys))
}

/// The server's side of an encrypted handshake on `sock`, within `deadline`. Nothing beyond the
/// AUTH is read from a client that fails it.
pub fn server_handshake(sock: &TcpStream, secret: &[u8], deadline: Instant, peer: &str) -> Result<Session> {
    let mine = Ephemeral::generate()?;
    let raw_hello = hello(ENCRYPTED, &random::<NONCE_LEN>()?, &mine.public);
    write_full(sock, &raw_hello, Some(deadline))?;
    let mut auth = [0u8; AUTH_LEN];
    if read_full(sock, &mut auth, Some(deadline))? < AUTH_LEN {
        return Err(Error::Closed(format!("connection from {peer} closed during the handshake")));
    }
    let (answer, keys) = server_auth(secret, ENCRYPTED, &raw_hello, &auth, Some(&mine), peer)?;
    write_full(sock, &answer, Some(deadline))?;
    let keys = keys.ok_or_else(|| Error::Protocol("no keys from an encrypted handshake".into()))?;
    Ok(Session::server(&keys))
}

#[cfg(test)]
mod tests;
