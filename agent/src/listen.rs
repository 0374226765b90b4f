//! Whether something listens on a TCP port in this network namespace, read
//! from `/proc/self/net/tcp` and `/proc/self/net/tcp6` (the tables of the
//! reader's own namespace: in a pod, the pod's).
//!
//! Invariants:
//! 1. Nothing connects to the port: a listener that accepts one connection
//!    at a time (Monarch's worker) never sees a probe.
//! 2. Only sockets in state LISTEN (`0A`) count, on any local address.

use std::io;

/// The kernel's TCP state number of LISTEN, as the tables print it.
const LISTEN: &str = "0A";

/// The socket tables read, IPv4 then IPv6.
const TABLES: [&str; 2] = ["/proc/self/net/tcp", "/proc/self/net/tcp6"];

/// Whether a socket of this namespace listens on TCP `port` (invariants 1,
/// 2). A missing IPv6 table (IPv6 disabled) counts as empty; another read
/// error is returned.
pub(crate) fn listening(port: u16) -> io::Result<bool> {
    for table in TABLES {
        match std::fs::read_to_string(table) {
            Ok(text) if table_listens(&text, port) => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Whether the table `text` (the format of `/proc/net/tcp`) has a LISTEN
/// socket on `port`.
fn table_listens(text: &str, port: u16) -> bool {
    text.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace();
        let (Some(_slot), Some(local), Some(_remote), Some(state)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        let local_port = local
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        state == LISTEN && local_port == Some(port)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:67D8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0
   1: 0100007F:67D9 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 3 1 0 100 0 0 10 0
";

    #[test]
    fn only_listen_sockets_on_the_port_count() {
        assert!(table_listens(TCP, 26584)); // 0x67D8
        assert!(!table_listens(TCP, 26585), "established, not listening");
        assert!(!table_listens(TCP, 80));
        assert!(table_listens(TCP6, 8080));
        assert!(!table_listens("", 8080));
        assert!(!table_listens("header\ngarbage line\n", 8080));
    }

    #[test]
    fn a_real_listener_is_seen_without_a_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening(port).unwrap());
        drop(l);
        assert!(!listening(port).unwrap());
    }
}
