//! The wire against the known-answer vectors the Python side generates
//! (`tests/unit/test_channel_crypto.py`), and table tests of the pure parsers.

use super::*;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

fn vectors() -> serde_json::Value {
    // at run time first: a test binary cached in a shared target dir may come from another checkout
    let path = std::env::var("TFOS_VECTORS")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../../tests/vectors/channel-v5.json").to_string());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    serde_json::from_str(&text).expect("the vectors are JSON")
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn field(v: &serde_json::Value, path: &[&str]) -> Vec<u8> {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    hex(x.as_str().unwrap_or_else(|| panic!("no string at {path:?}")))
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    b.try_into().expect("length")
}

type Transcript = ([u8; HELLO_LEN], [u8; AUTH_LEN], [u8; MAC_LEN], Option<Keys>, Option<Keys>);

/// Runs both sides of the handshake with the vectors' fixed keys and nonces; returns
/// (hello, auth, finish, client keys, server keys).
fn handshake(v: &serde_json::Value, mode: u8, server_nonce: [u8; 16]) -> Transcript {
    let secret = field(v, &["secret"]);
    let server_eph = Ephemeral::from_private(arr(&field(v, &["server_private"])));
    let client_eph = Ephemeral::from_private(arr(&field(v, &["client_private"])));
    let (s_eph, c_eph) = if mode == ENCRYPTED { (Some(&server_eph), Some(&client_eph)) } else { (None, None) };
    let h = hello(mode, &server_nonce, &server_eph.public);
    let (auth, pending) = client_auth(&secret, mode, &h, &arr(&field(v, &["client_nonce"])), c_eph, "server").unwrap();
    let (finish, server_keys) = server_auth(&secret, mode, &h, &auth, s_eph, "client").unwrap();
    let client_keys = client_finish(&secret, &pending, &finish, c_eph, "server").unwrap();
    (h, auth, finish, client_keys, server_keys)
}

#[test]
fn handshake_bytes_match_the_known_answers_in_both_modes() {
    let v = vectors();
    let nonce = arr(&field(&v, &["server_nonce"]));
    for (mode, name) in [(CLEAR, "clear"), (ENCRYPTED, "encrypted")] {
        let (h, auth, finish, ck, sk) = handshake(&v, mode, nonce);
        assert_eq!(h.to_vec(), field(&v, &[name, "hello"]), "{name} hello");
        assert_eq!(auth.to_vec(), field(&v, &[name, "auth"]), "{name} auth");
        assert_eq!(finish.to_vec(), field(&v, &[name, "finish"]), "{name} finish");
        assert_eq!(ck, sk, "{name}: both sides derive the same keys");
        assert_eq!(ck.is_some(), mode == ENCRYPTED);
    }
}

fn vector_keys(v: &serde_json::Value) -> Keys {
    handshake(v, ENCRYPTED, arr(&field(v, &["server_nonce"]))).3.unwrap()
}

fn side_key(keys: &Keys, from: &str) -> ([u8; 32], [u8; 12]) {
    if from == "client" {
        (keys.client_key, keys.client_iv)
    } else {
        (keys.server_key, keys.server_iv)
    }
}

#[test]
fn records_match_the_known_answers_and_open_back() {
    let v = vectors();
    let keys = vector_keys(&v);
    let records = v["encrypted"]["records"].as_array().unwrap();
    assert!(!records.is_empty());
    for r in records {
        let from = r["from"].as_str().unwrap();
        let seq = r["seq"].as_u64().unwrap();
        let plain = hex(r["plaintext"].as_str().unwrap());
        let expected = hex(r["record"].as_str().unwrap());
        let (key, iv) = side_key(&keys, from);
        let mut sealer = Sealer::new(&key, &iv);
        sealer.seq = seq;
        assert_eq!(sealer.seal_to_vec(&plain).unwrap(), expected, "record {from}/{seq}");
        assert_eq!(sealer.seq, seq + 1);
        // the same bytes sealed in place in a larger buffer
        let mut buf = vec![0xAAu8; plain.len() + 64];
        buf[4..4 + plain.len()].copy_from_slice(&plain);
        let mut sealer = Sealer::new(&key, &iv);
        sealer.seq = seq;
        let n = sealer.seal(&mut buf, plain.len()).unwrap();
        assert_eq!(&buf[..n], &expected[..]);

        let header: [u8; 4] = arr(&expected[..4]);
        assert_eq!(record_length(header).unwrap(), expected.len() - 4);
        let mut opener = Opener::new(&key, &iv);
        opener.seq = seq;
        let mut body = expected[4..].to_vec();
        let n = opener.open(header, &mut body).unwrap();
        assert_eq!(&body[..n], &plain[..]);
        assert_eq!(opener.seq, seq + 1);
    }
}

#[test]
fn changed_replayed_or_foreign_records_fail_to_open() {
    let v = vectors();
    let keys = vector_keys(&v);
    // another connection: same secret and private keys, another server nonce
    let other = handshake(&v, ENCRYPTED, [0x55; 16]).3.unwrap();
    assert_ne!(other, keys);
    for r in v["encrypted"]["records"].as_array().unwrap() {
        let from = r["from"].as_str().unwrap();
        let seq = r["seq"].as_u64().unwrap();
        let record = hex(r["record"].as_str().unwrap());
        let (key, iv) = side_key(&keys, from);
        let try_open = |rec: &[u8], key: &[u8; 32], iv: &[u8; 12], seq: u64| {
            let mut opener = Opener::new(key, iv);
            opener.seq = seq;
            let mut body = rec[4..].to_vec();
            let r = opener.open(arr(&rec[..4]), &mut body);
            if r.is_err() {
                assert_eq!(opener.seq, seq, "a failed record does not advance the sequence");
            }
            r
        };
        assert!(try_open(&record, &key, &iv, seq).is_ok());
        for i in 0..record.len() {
            let mut bad = record.clone();
            bad[i] ^= 0x01;
            assert!(try_open(&bad, &key, &iv, seq).is_err(), "flipped byte {i} of {from}/{seq} opened");
        }
        assert!(try_open(&record, &key, &iv, seq + 1).is_err(), "replayed at another sequence number");
        if seq > 0 {
            assert!(try_open(&record, &key, &iv, seq - 1).is_err());
        }
        let (okey, oiv) = side_key(&other, from);
        assert!(try_open(&record, &okey, &oiv, seq).is_err(), "another connection's key");
        let (rkey, riv) = side_key(&keys, if from == "client" { "server" } else { "client" });
        assert!(try_open(&record, &rkey, &riv, seq).is_err(), "the other direction's key");
    }
}

#[test]
fn tunnel_open_matches_the_known_answer() {
    let v = vectors();
    assert_eq!(Message::TunnelOpen { port: 7000 }.frame(), field(&v, &["encrypted", "tunnel_open"]));
    // and the vector's first record is an Ack's JSON
    let ack = hex(v["encrypted"]["records"][0]["plaintext"].as_str().unwrap());
    assert_eq!(Message::Ack.encode(), ack);
}

#[test]
fn a_wrong_secret_or_mode_is_refused_on_both_sides() {
    let v = vectors();
    let secret = field(&v, &["secret"]);
    let wrong = vec![7u8; 32];
    let s_eph = Ephemeral::from_private([0x11; 32]);
    let c_eph = Ephemeral::from_private([0x22; 32]);
    let h = hello(ENCRYPTED, &[3; 16], &s_eph.public);
    // the server refuses a client without the secret
    let (auth, _) = client_auth(&wrong, ENCRYPTED, &h, &[4; 16], Some(&c_eph), "s").unwrap();
    assert!(matches!(server_auth(&secret, ENCRYPTED, &h, &auth, Some(&s_eph), "c"), Err(Error::Auth(_))));
    // the client refuses a server without the secret
    let (auth, pending) = client_auth(&secret, ENCRYPTED, &h, &[4; 16], Some(&c_eph), "s").unwrap();
    let (finish, _) = server_auth(&secret, ENCRYPTED, &h, &auth, Some(&s_eph), "c").unwrap();
    assert!(client_finish(&secret, &pending, &finish, Some(&c_eph), "s").is_ok());
    let mut bad = finish;
    bad[31] ^= 1;
    assert!(matches!(client_finish(&secret, &pending, &bad, Some(&c_eph), "s"), Err(Error::Auth(_))));
    // modes: an encrypted client refuses a clear server and the other way round
    let clear_hello = hello(CLEAR, &[3; 16], &s_eph.public);
    assert!(matches!(
        client_auth(&secret, ENCRYPTED, &clear_hello, &[4; 16], Some(&c_eph), "s"),
        Err(Error::Protocol(_))
    ));
    let (clear_auth, _) = client_auth(&secret, CLEAR, &clear_hello, &[4; 16], None, "s").unwrap();
    assert!(matches!(server_auth(&secret, ENCRYPTED, &h, &clear_auth, Some(&s_eph), "c"), Err(Error::Protocol(_))));
    // an AUTH whose mode byte was rewritten fails its MAC
    let mut rewritten = auth;
    rewritten[0] = CLEAR;
    assert!(server_auth(&secret, CLEAR, &h, &rewritten, None, "c").is_err());
    // an unknown mode byte
    let mut odd = auth;
    odd[0] = 9;
    assert!(matches!(server_auth(&secret, ENCRYPTED, &h, &odd, Some(&s_eph), "c"), Err(Error::Protocol(_))));
}

#[test]
fn an_all_zero_key_share_is_refused() {
    let v = vectors();
    let secret = field(&v, &["secret"]);
    let s_eph = Ephemeral::from_private([0x11; 32]);
    let c_eph = Ephemeral::from_private([0x22; 32]);
    let h = hello(ENCRYPTED, &[3; 16], &s_eph.public);
    // a client that sends the zero point (low order) with a valid MAC: the server refuses
    let mut transcript = h.to_vec();
    transcript.push(ENCRYPTED);
    transcript.extend_from_slice(&[4; 16]);
    transcript.extend_from_slice(&[0; 32]);
    let mac = client_mac(&secret, &transcript);
    let mut auth = [0u8; AUTH_LEN];
    auth[..49].copy_from_slice(&transcript[55..]);
    auth[49..].copy_from_slice(&mac);
    assert!(matches!(server_auth(&secret, ENCRYPTED, &h, &auth, Some(&s_eph), "c"), Err(Error::Auth(_))));
    assert!(matches!(c_eph.shared(&[0; 32]), Err(Error::Auth(_))));
    assert!(derive_keys(&secret, &[0; 32], b"t", b"c", b"s").is_err());
}

#[test]
fn hello_parsing() {
    let good = hello(ENCRYPTED, &[1; 16], &[2; 32]);
    assert_eq!(parse_hello(&good, "p").unwrap(), Hello { mode: ENCRYPTED, nonce: [1; 16], public: [2; 32] });
    assert_eq!(parse_hello(&hello(CLEAR, &[1; 16], &[2; 32]), "p").unwrap().public, [0; 32]);
    let cases: [(usize, u8, &str); 4] = [
        (0, b'X', "not a tfos endpoint"),
        (5, 4, "protocol v4"),
        (4, 1, "protocol v261"),
        (6, 2, "unknown channel mode 2"),
    ];
    for (at, byte, needle) in cases {
        let mut bad = good;
        bad[at] = byte;
        let e = parse_hello(&bad, "p").unwrap_err().to_string();
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
    }
}

#[test]
fn record_length_table() {
    let cases: [(u32, Option<usize>); 7] = [
        (0, None),
        (15, None),
        (16, Some(16)),
        (17, Some(17)),
        ((MAX_RECORD + TAG_LEN) as u32, Some(MAX_RECORD + TAG_LEN)),
        ((MAX_RECORD + TAG_LEN + 1) as u32, None),
        (u32::MAX, None),
    ];
    for (n, want) in cases {
        assert_eq!(record_length(n.to_be_bytes()).ok(), want, "length {n}");
    }
}

#[test]
fn frame_length_table() {
    let f = |kind: u8, n: u32| {
        let mut h = [kind, 0, 0, 0, 0];
        h[1..].copy_from_slice(&n.to_be_bytes());
        frame_length(h).ok()
    };
    assert_eq!(f(b'J', 0), Some(0));
    assert_eq!(f(b'J', 40), Some(40));
    assert_eq!(f(b'J', MAX_JSON_FRAME as u32), Some(MAX_JSON_FRAME));
    assert_eq!(f(b'J', MAX_JSON_FRAME as u32 + 1), None);
    assert_eq!(f(b'J', u32::MAX), None);
    assert_eq!(f(b'A', 10), None);
    assert_eq!(f(0, 10), None);
}

#[test]
fn message_parsing_table() {
    let ok: [(&str, Message); 7] = [
        (r#"{"port":7000,"type":"TunnelOpen","v":5}"#, Message::TunnelOpen { port: 7000 }),
        (r#"{"v":5,"type":"TunnelOpen","port":1}"#, Message::TunnelOpen { port: 1 }),
        (r#"{"type":"TunnelOpen","port":65535,"v":5,"extra":[1]}"#, Message::TunnelOpen { port: 65535 }),
        (r#"{"type":"Ack","v":5}"#, Message::Ack),
        (r#" { "v" : 5 , "type" : "Ack" } "#, Message::Ack),
        (r#"{"type":"ErrorReply","v":5,"message":"no"}"#, Message::ErrorReply { message: "no".into() }),
        (r#"{"message":"\u00e9\"x","type":"ErrorReply","v":5}"#, Message::ErrorReply { message: "é\"x".into() }),
    ];
    for (text, want) in ok {
        assert_eq!(parse_message(text.as_bytes()).unwrap(), want, "{text}");
    }
    let bad = [
        r#"{"port":7000,"type":"TunnelOpen","v":4}"#,
        r#"{"port":7000,"type":"TunnelOpen"}"#,
        r#"{"port":7000,"type":"TunnelOpen","v":"5"}"#,
        r#"{"port":0,"type":"TunnelOpen","v":5}"#,
        r#"{"port":65536,"type":"TunnelOpen","v":5}"#,
        r#"{"port":-1,"type":"TunnelOpen","v":5}"#,
        r#"{"port":70.5,"type":"TunnelOpen","v":5}"#,
        r#"{"port":"7000","type":"TunnelOpen","v":5}"#,
        r#"{"port":true,"type":"TunnelOpen","v":5}"#,
        r#"{"type":"TunnelOpen","v":5}"#,
        r#"{"type":"ErrorReply","v":5}"#,
        r#"{"type":"Nope","v":5}"#,
        r#"{"v":5}"#,
        r#"[1,2]"#,
        r#"{"type":"Ack","v":5"#,
        "\u{ff}",
        "",
    ];
    for text in bad {
        assert!(matches!(parse_message(text.as_bytes()), Err(Error::Protocol(_))), "{text:?} parsed");
    }
}

#[test]
fn messages_encode_as_python_does() {
    assert_eq!(Message::TunnelOpen { port: 7000 }.encode(), br#"{"port":7000,"type":"TunnelOpen","v":5}"#.to_vec());
    assert_eq!(Message::Ack.encode(), br#"{"type":"Ack","v":5}"#.to_vec());
    // json.dumps({"message": 'a"\\é😀\x01\x7f\n', ...}, separators=(",", ":"))
    let m = Message::ErrorReply { message: "a\"\\é😀\u{1}\u{7f}\n".into() };
    assert_eq!(
        String::from_utf8(m.encode()).unwrap(),
        r#"{"message":"a\"\\\u00e9\ud83d\ude00\u0001\u007f\n","type":"ErrorReply","v":5}"#
    );
    for msg in [Message::TunnelOpen { port: 22 }, Message::Ack, m] {
        assert_eq!(parse_message(&msg.encode()).unwrap(), msg);
    }
}

/// The socket wrappers end to end: a handshake, a message each way, large data, close_notify.
#[test]
fn sessions_over_a_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let secret = [9u8; 32];
    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = server_handshake(&sock, &secret, deadline, "client").unwrap();
        assert_eq!(s.reader.read_message(&sock, Some(deadline)).unwrap(), Message::TunnelOpen { port: 99 });
        s.writer.send_message(&sock, &Message::Ack, Some(deadline)).unwrap();
        let mut data = vec![0u8; 3 * MAX_RECORD + 5];
        s.reader.read_exact(&sock, &mut data, Some(deadline)).unwrap();
        assert!(data.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
        assert!(!s.reader.next_record(&sock, Some(deadline)).unwrap(), "close_notify");
    });
    let sock = TcpStream::connect(addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = client_handshake(&sock, &secret, deadline, "server").unwrap();
    c.writer.send_message(&sock, &Message::TunnelOpen { port: 99 }, Some(deadline)).unwrap();
    assert_eq!(c.reader.read_message(&sock, Some(deadline)).unwrap(), Message::Ack);
    let data: Vec<u8> = (0..3 * MAX_RECORD + 5).map(|i| (i % 251) as u8).collect();
    c.writer.send(&sock, &data, Some(deadline)).unwrap();
    c.writer.close_notify(&sock, Some(deadline)).unwrap();
    server.join().unwrap();
}

#[test]
fn a_client_with_another_secret_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        server_handshake(&sock, &[1u8; 32], deadline, "client").err()
    });
    let sock = TcpStream::connect(addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = client_handshake(&sock, &[2u8; 32], deadline, "server").err().expect("refused");
    assert!(e.to_string().contains("wrong cluster secret"), "{e}");
    assert!(matches!(server.join().unwrap(), Some(Error::Auth(_))));
}
