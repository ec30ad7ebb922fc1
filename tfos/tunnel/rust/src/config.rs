//! What the tunnel is told: its one-line JSON config, the peer table, the control socket's
//! requests. Pure parsing, table-tested.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// `netns` in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsMode {
    /// Try a private namespace, fall back to loopback mode.
    Auto,
    /// Loopback mode.
    Off,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub secret: Vec<u8>,
    pub self_ip: Ipv4Addr,
    pub block: [u8; 2],
    pub control: PathBuf,
    pub bind_host: String,
    pub netns: NetnsMode,
}

/// Bytes from hex (either case).
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

fn parse_block(s: &str) -> Option<[u8; 2]> {
    let (a, b) = s.split_once('.')?;
    let octet = |x: &str| {
        if x.is_empty() || x.len() > 3 || !x.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            x.parse::<u8>().ok()
        }
    };
    Some([octet(a)?, octet(b)?])
}

/// Whether `ip` is in the node address block `block` (its first two octets).
pub fn in_block(ip: Ipv4Addr, block: [u8; 2]) -> bool {
    ip.octets()[..2] == block
}

/// Parse the config line. Unknown keys are ignored; `bind_host` defaults to `0.0.0.0` and
/// `netns` to `auto`.
pub fn parse_config(line: &str) -> Result<Config, String> {
    let v: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| format!("config is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("config is not a JSON object")?;
    let string = |k: &str| -> Result<&str, String> {
        obj.get(k).and_then(|x| x.as_str()).ok_or(format!("config: {k} must be a string"))
    };
    let secret = from_hex(string("secret")?).ok_or("config: secret is not hex")?;
    if secret.len() < 16 {
        return Err("config: secret is shorter than 16 bytes".into());
    }
    let self_ip: Ipv4Addr = string("self_ip")?.parse().map_err(|_| "config: self_ip is not an IPv4 address")?;
    let block = parse_block(string("block")?).ok_or("config: block must be two octets like 127.77")?;
    if !in_block(self_ip, block) {
        return Err(format!("config: self_ip {self_ip} is outside the block {}.{}", block[0], block[1]));
    }
    let control = PathBuf::from(string("control")?);
    if !control.is_absolute() {
        return Err("config: control must be an absolute path".into());
    }
    let bind_host = match obj.get("bind_host") {
        None => "0.0.0.0".to_string(),
        Some(_) => string("bind_host")?.to_string(),
    };
    let netns = match obj.get("netns").map(|x| x.as_str()) {
        None | Some(Some("auto")) => NetnsMode::Auto,
        Some(Some("off")) => NetnsMode::Off,
        _ => return Err("config: netns must be \"auto\" or \"off\"".into()),
    };
    Ok(Config { secret, self_ip, block, control, bind_host, netns })
}

/// Another node: its address in the block, and where its tunnel's ingress listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub addr: Ipv4Addr,
    pub host: String,
    pub port: u16,
    /// It runs on this host (in loopback mode its TF server holds `addr` itself).
    pub local: bool,
    /// A peer on this host in its own namespace: its tunnel's control socket, which hands out
    /// sockets in that namespace, so that connections to `addr` go straight in, not through
    /// two tunnels.
    pub control: Option<PathBuf>,
}

/// The peer table.
#[derive(Debug, Default)]
pub struct PeerTable {
    peers: HashMap<Ipv4Addr, Peer>,
}

impl PeerTable {
    /// Add or replace entries.
    pub fn update(&mut self, entries: Vec<Peer>) {
        for p in entries {
            self.peers.insert(p.addr, p);
        }
    }

    pub fn get(&self, addr: Ipv4Addr) -> Option<&Peer> {
        self.peers.get(&addr)
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

/// The longest control socket path a peer may name (a unix socket address holds 107 bytes).
pub const MAX_CONTROL_PATH: usize = 107;

/// Parse a PEERS table: `[["127.77.0.2", "10.1.2.3", 41234, false], ...]`, each row optionally
/// with a fifth entry, a local peer's control socket (an absolute path; "" for none). Every
/// address must be in the block; an entry for this node's own address is left out. All or nothing.
pub fn parse_peers(json: &str, block: [u8; 2], self_ip: Ipv4Addr) -> Result<Vec<Peer>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("PEERS: not JSON: {e}"))?;
    let rows = v.as_array().ok_or("PEERS: expected a JSON array")?;
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let bad = |what: &str| format!("PEERS[{i}]: {what}");
        let r = row
            .as_array()
            .filter(|r| r.len() == 4 || r.len() == 5)
            .ok_or_else(|| bad("expected [address, host, port, local] or [address, host, port, local, control]"))?;
        let addr: Ipv4Addr =
            r[0].as_str().and_then(|s| s.parse().ok()).ok_or_else(|| bad("address must be an IPv4 address"))?;
        if !in_block(addr, block) {
            return Err(bad(&format!("address {addr} is outside the block {}.{}", block[0], block[1])));
        }
        let host = r[1]
            .as_str()
            .filter(|h| !h.is_empty() && !h.chars().any(char::is_whitespace))
            .ok_or_else(|| bad("host must be a host name or address"))?;
        let port = r[2].as_u64().filter(|p| (1..=65535).contains(p)).ok_or_else(|| bad("port must be 1..65535"))?;
        let local = r[3].as_bool().ok_or_else(|| bad("local must be true or false"))?;
        let control = match r.get(4) {
            None => None,
            Some(v) => match v.as_str() {
                Some("") => None,
                Some(p) if local && p.starts_with('/') && p.len() <= MAX_CONTROL_PATH && !p.contains('\0') => {
                    Some(PathBuf::from(p))
                }
                _ => {
                    return Err(bad("control must be \"\" or, for a local peer, an absolute path of at most 107 bytes"))
                }
            },
        };
        if addr != self_ip {
            out.push(Peer { addr, host: host.to_string(), port: port as u16, local, control });
        }
    }
    Ok(out)
}

/// One control socket request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Socket { domain: i32, ty: i32, protocol: i32 },
    Connect { domain: i32, ty: i32, protocol: i32, addr: Ipv4Addr, port: u16 },
    Peers(Vec<Peer>),
    Ping,
}

/// Parse one request line (without its newline).
pub fn parse_request(line: &str, block: [u8; 2], self_ip: Ipv4Addr) -> Result<Request, String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
    let ints = |words: &[&str]| -> Result<[i32; 3], String> {
        let mut out = [0i32; 3];
        for (o, w) in out.iter_mut().zip(words) {
            *o = w.parse().map_err(|_| format!("{verb}: {w:?} is not an integer"))?;
        }
        Ok(out)
    };
    match verb {
        "PING" if rest.is_empty() => Ok(Request::Ping),
        "SOCKET" => {
            let w: Vec<&str> = rest.split(' ').collect();
            if w.len() != 3 {
                return Err("SOCKET: expected <domain> <type> <protocol>".into());
            }
            let [domain, ty, protocol] = ints(&w)?;
            Ok(Request::Socket { domain, ty, protocol })
        }
        "CONNECT" => {
            let w: Vec<&str> = rest.split(' ').collect();
            if w.len() != 5 {
                return Err("CONNECT: expected <domain> <type> <protocol> <a.b.c.d> <port>".into());
            }
            let [domain, ty, protocol] = ints(&w[..3])?;
            let addr: Ipv4Addr = w[3].parse().map_err(|_| format!("CONNECT: {:?} is not an IPv4 address", w[3]))?;
            let port =
                w[4].parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("CONNECT: bad port {:?}", w[4]))?;
            Ok(Request::Connect { domain, ty, protocol, addr, port })
        }
        "PEERS" => Ok(Request::Peers(parse_peers(rest, block, self_ip)?)),
        _ => {
            let shown: String = verb.chars().take(32).collect();
            Err(format!("unknown request {shown:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: [u8; 2] = [127, 77];
    const ME: Ipv4Addr = Ipv4Addr::new(127, 77, 0, 1);

    #[test]
    fn config_parsing() {
        let good = r#"{"secret": "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", "self_ip": "127.77.0.1", "block": "127.77", "control": "/tmp/x/ctl.sock", "bind_host": "0.0.0.0", "netns": "auto", "other": 1}"#;
        let c = parse_config(good).unwrap();
        assert_eq!(c.secret, (0u8..32).collect::<Vec<_>>());
        assert_eq!((c.self_ip, c.block, c.netns), (ME, BLOCK, NetnsMode::Auto));
        assert_eq!(c.control, PathBuf::from("/tmp/x/ctl.sock"));
        assert_eq!(c.bind_host, "0.0.0.0");
        let off = good.replace("\"auto\"", "\"off\"");
        assert_eq!(parse_config(&off).unwrap().netns, NetnsMode::Off);
        let minimal =
            r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"10.9.0.3","block":"10.9","control":"/c"}"#;
        let c = parse_config(minimal).unwrap();
        assert_eq!((c.bind_host.as_str(), c.netns, c.block), ("0.0.0.0", NetnsMode::Auto, [10, 9]));
        let bad = [
            ("", "not JSON"),
            ("[]", "not a JSON object"),
            (r#"{"self_ip":"127.77.0.1","block":"127.77","control":"/c"}"#, "secret"),
            (r#"{"secret":"0g","self_ip":"127.77.0.1","block":"127.77","control":"/c"}"#, "not hex"),
            (r#"{"secret":"0011","self_ip":"127.77.0.1","block":"127.77","control":"/c"}"#, "shorter"),
            (
                r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"127.77.0","block":"127.77","control":"/c"}"#,
                "self_ip",
            ),
            (
                r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"127.78.0.1","block":"127.77","control":"/c"}"#,
                "outside",
            ),
            (
                r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"127.77.0.1","block":"127","control":"/c"}"#,
                "block",
            ),
            (
                r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"127.77.0.1","block":"127.777","control":"/c"}"#,
                "block",
            ),
            (
                r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"127.77.0.1","block":"127.77","control":"c"}"#,
                "absolute",
            ),
            (
                r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"127.77.0.1","block":"127.77","control":"/c","netns":"on"}"#,
                "netns",
            ),
            (
                r#"{"secret":"00112233445566778899aabbccddeeff","self_ip":"127.77.0.1","block":"127.77","control":"/c","bind_host":1}"#,
                "bind_host",
            ),
        ];
        for (line, needle) in bad {
            let e = parse_config(line).unwrap_err();
            assert!(e.contains(needle), "{line}: {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn peers_parsing() {
        let p = parse_peers(r#"[["127.77.0.2", "10.1.2.3", 41234, false], ["127.77.0.1", "h", 1, true], ["127.77.0.3", "node-3.example", 65535, true], ["127.77.0.4", "h", 2, true, "/tmp/d/tunnel.sock"], ["127.77.0.5", "h", 3, false, ""]]"#, BLOCK, ME).unwrap();
        let peer = |addr, host: &str, port, local, control: Option<&str>| Peer {
            addr,
            host: host.into(),
            port,
            local,
            control: control.map(PathBuf::from),
        };
        assert_eq!(
            p,
            vec![
                peer(Ipv4Addr::new(127, 77, 0, 2), "10.1.2.3", 41234, false, None),
                peer(Ipv4Addr::new(127, 77, 0, 3), "node-3.example", 65535, true, None),
                peer(Ipv4Addr::new(127, 77, 0, 4), "h", 2, true, Some("/tmp/d/tunnel.sock")),
                peer(Ipv4Addr::new(127, 77, 0, 5), "h", 3, false, None),
            ]
        );
        assert_eq!(parse_peers("[]", BLOCK, ME).unwrap(), vec![]);
        for bad in [
            "",
            "{}",
            "[1]",
            r#"[["127.77.0.2", "h", 1]]"#,
            r#"[["127.77.0.2", "h", 1, false, 5]]"#,
            r#"[["127.77.0.2", "h", 1, true, "relative.sock"]]"#,
            r#"[["127.77.0.2", "h", 1, false, "/tmp/d/tunnel.sock"]]"#,
            r#"[["127.77.0.2", "h", 1, true, "/tmp/a\u0000b"]]"#,
            r#"[["127.77.0.2", "h", 1, true, "/tmp/d/tunnel.sock", 1]]"#,
            r#"[["127.78.0.2", "h", 1, false]]"#,
            r#"[["127.77.0.2", "", 1, false]]"#,
            r#"[["127.77.0.2", "a b", 1, false]]"#,
            r#"[["127.77.0.2", "h", 0, false]]"#,
            r#"[["127.77.0.2", "h", 65536, false]]"#,
            r#"[["127.77.0.2", "h", "1", false]]"#,
            r#"[["127.77.0.2", "h", 1, 0]]"#,
            r#"[["::1", "h", 1, false]]"#,
            r#"[["127.77.0.2", "h", 1, false], ["x", "h", 1, false]]"#,
        ] {
            assert!(parse_peers(bad, BLOCK, ME).is_err(), "{bad:?} parsed");
        }
        let long = format!(r#"[["127.77.0.2", "h", 1, true, "/{}"]]"#, "x".repeat(MAX_CONTROL_PATH));
        assert!(parse_peers(&long, BLOCK, ME).is_err());
    }

    #[test]
    fn peer_table_adds_and_replaces() {
        let mut t = PeerTable::default();
        assert!(t.is_empty());
        let a = Ipv4Addr::new(127, 77, 0, 2);
        t.update(vec![Peer { addr: a, host: "h1".into(), port: 1, local: false, control: None }]);
        t.update(vec![
            Peer { addr: a, host: "h2".into(), port: 2, local: true, control: None },
            Peer { addr: Ipv4Addr::new(127, 77, 0, 3), host: "h3".into(), port: 3, local: false, control: None },
        ]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(a).unwrap().host, "h2");
        assert!(t.get(a).unwrap().local);
        assert!(t.get(Ipv4Addr::new(127, 77, 0, 9)).is_none());
    }

    #[test]
    fn request_parsing() {
        let ok = [
            ("PING", Request::Ping),
            ("PING\r", Request::Ping),
            ("SOCKET 2 1 0", Request::Socket { domain: 2, ty: 1, protocol: 0 }),
            ("SOCKET 10 526337 6", Request::Socket { domain: 10, ty: 526337, protocol: 6 }),
            (
                "CONNECT 2 1 0 127.77.0.2 7000",
                Request::Connect { domain: 2, ty: 1, protocol: 0, addr: Ipv4Addr::new(127, 77, 0, 2), port: 7000 },
            ),
            (
                "CONNECT 10 2049 0 10.0.0.1 65535",
                Request::Connect { domain: 10, ty: 2049, protocol: 0, addr: Ipv4Addr::new(10, 0, 0, 1), port: 65535 },
            ),
            ("PEERS []", Request::Peers(vec![])),
        ];
        for (line, want) in ok {
            assert_eq!(parse_request(line, BLOCK, ME).unwrap(), want, "{line}");
        }
        for bad in [
            "",
            "PING x",
            "ping",
            "SOCKET",
            "SOCKET 2 1",
            "SOCKET 2 1 0 0",
            "SOCKET 2 x 0",
            "SOCKET  2 1 0",
            "CONNECT 2 1 0 127.77.0.2",
            "CONNECT 2 1 0 127.77.0.2 0",
            "CONNECT 2 1 0 127.77.0.2 65536",
            "CONNECT 2 1 0 ::1 80",
            "CONNECT 2 1 0 localhost 80",
            "PEERS",
            "PEERS [[",
            "HELLO",
        ] {
            assert!(parse_request(bad, BLOCK, ME).is_err(), "{bad:?} parsed");
        }
    }
}
