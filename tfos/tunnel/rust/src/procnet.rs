//! Who owns the other end of a loopback TCP connection: `/proc/net/tcp` (and `tcp6`, where an
//! IPv6 socket's v4-mapped connection appears) list each socket's local and remote address and
//! its owner's uid. Used by loopback-mode egress listeners, which any local process could reach.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

/// One line of `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    pub uid: u32,
}

const TIME_WAIT: u8 = 0x06;

/// An address as the kernel prints it: the raw in_addr/in6_addr words as native-endian hex
/// (`%08X` each), a colon, the port in hex.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = ip.get(8 * i..8 * i + 8)?;
        Some(u32::from_str_radix(w, 16).ok()?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Parse one line (None for the header and anything malformed). Fields: `sl local rem st
/// tx:rx tr:when retrnsmt uid timeout inode ...`.
pub fn parse_line(line: &str) -> Option<Entry> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 || !f[0].ends_with(':') {
        return None;
    }
    Some(Entry {
        local: parse_addr(f[1])?,
        remote: parse_addr(f[2])?,
        state: u8::from_str_radix(f[3], 16).ok()?,
        uid: f[7].parse().ok()?,
    })
}

/// The uid of the live socket whose local address is `local` and remote address `remote`, in
/// the text of one `/proc/net/tcp{,6}` file.
pub fn find_uid(text: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    text.lines()
        .filter_map(parse_line)
        .find(|e| e.state != TIME_WAIT && e.local == local && e.remote == remote)
        .map(|e| e.uid)
}

fn mapped(a: SocketAddrV4) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(a.ip().to_ipv6_mapped()), a.port())
}

/// The uid of the process side of a connection accepted on this host: `client` is the accepted
/// connection's peer address, `server` its local address. None if it cannot be found.
pub fn client_uid(client: SocketAddrV4, server: SocketAddrV4) -> Option<u32> {
    if let Ok(text) = std::fs::read_to_string("/proc/net/tcp") {
        if let Some(uid) = find_uid(&text, SocketAddr::V4(client), SocketAddr::V4(server)) {
            return Some(uid);
        }
    }
    let text = std::fs::read_to_string("/proc/net/tcp6").ok()?;
    find_uid(&text, mapped(client), mapped(server))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as a little-endian kernel prints them.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A2C4 02004D7F:1B58 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0000000000000000 20 4 30 10 -1
   2: 02004D7F:1B58 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:A2C5 02004D7F:1B58 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0000000000000000
   4: 0100007F:A2C5 02004D7F:1B58 01 00000000:00000000 00:00000000 00000000  4242        0 5 1 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:C350 0000000000000000FFFF000002004D7F:1B58 01 00000000:00000000 00:00000000 00000000  1001        0 9 1 0000000000000000 20 4 30 10 -1
   1: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 10 1 0000000000000000 100 0 0 10 0
";

    fn v4(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_parse_from_native_endian_words() {
        if cfg!(target_endian = "little") {
            assert_eq!(parse_addr("0100007F:1F90"), Some(v4("127.0.0.1:8080")));
            assert_eq!(parse_addr("02004D7F:1B58"), Some(v4("127.77.0.2:7000")));
            assert_eq!(parse_addr("00000000000000000000000001000000:0016"), Some("[::1]:22".parse().unwrap()));
            assert_eq!(
                parse_addr("0000000000000000FFFF00000100007F:C350"),
                Some("[::ffff:127.0.0.1]:50000".parse().unwrap())
            );
        }
        for bad in [
            "",
            "0100007F",
            "0100007F:",
            "0100007F:XYZ",
            "100007F:1F90",
            "0100007G:1F90",
            "0100007F:10000",
            "0100007F0:1F90",
        ] {
            assert_eq!(parse_addr(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn lines_parse_and_the_header_does_not() {
        let mut lines = TCP.lines();
        assert_eq!(parse_line(lines.next().unwrap()), None);
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_line(lines.next().unwrap()),
                Some(Entry { local: v4("127.0.0.1:8080"), remote: v4("0.0.0.0:0"), state: 0x0A, uid: 1000 })
            );
        }
        for bad in ["", "   0: 0100007F:1F90", "   0: 0100007F:1F90 00000000:0000 0A a b c notanumber"] {
            assert_eq!(parse_line(bad), None);
        }
    }

    #[test]
    fn the_client_socket_is_found_by_its_address_pair() {
        if !cfg!(target_endian = "little") {
            return;
        }
        let server = v4("127.77.0.2:7000");
        // the client's own line (local = client, remote = server), not the accepted side's
        assert_eq!(find_uid(TCP, v4("127.0.0.1:41668"), server), Some(1000));
        // a TIME_WAIT entry of the same pair is skipped for the live one
        assert_eq!(find_uid(TCP, v4("127.0.0.1:41669"), server), Some(4242));
        assert_eq!(find_uid(TCP, v4("127.0.0.1:41670"), server), None);
        assert_eq!(find_uid(TCP, server, v4("127.0.0.1:41668")), Some(0));
        // an IPv6 socket connected to the v4 listener: v4-mapped in tcp6
        let client = "127.0.0.1:50000".parse::<SocketAddrV4>().unwrap();
        let server4 = "127.77.0.2:7000".parse::<SocketAddrV4>().unwrap();
        assert_eq!(find_uid(TCP6, mapped(client), mapped(server4)), Some(1001));
        assert_eq!(find_uid(TCP, SocketAddr::V4(client), SocketAddr::V4(server4)), None);
    }

    #[test]
    fn a_real_connection_is_attributed_to_this_process_uid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let (SocketAddr::V4(peer), SocketAddr::V4(local)) = (peer, accepted.local_addr().unwrap()) else {
            panic!("IPv4 expected")
        };
        assert_eq!(client_uid(peer, local), Some(crate::sys::getuid()));
        drop(client);
    }
}
