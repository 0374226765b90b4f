//! The hosts file (`/etc/hosts`, hosts(5)): one address per line followed by
//! its canonical name and aliases; `#` starts a comment. Names match without
//! regard to case or a trailing dot, and every matching line counts, in file
//! order (glibc's `multi on`, which Kubernetes pods need: the kubelet writes
//! the pod's own name and each `hostAliases` entry as separate lines).

use std::net::IpAddr;

/// The addresses `text` (a hosts file) gives `name`, in file order, without
/// duplicates. Malformed lines are skipped, as the C libraries do.
pub fn lookup(text: &str, name: &str) -> Vec<IpAddr> {
    let want = name.trim_end_matches('.');
    if want.is_empty() {
        return Vec::new();
    }
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_ascii_whitespace();
        let Some(addr) = fields.next() else { continue };
        // A zone index (`fe80::1%eth0`) is not part of the address.
        let Ok(ip) = addr.split('%').next().unwrap_or(addr).parse::<IpAddr>() else {
            continue;
        };
        if fields.any(|n| n.trim_end_matches('.').eq_ignore_ascii_case(want))
            && !found.contains(&ip)
        {
            found.push(ip);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTS: &str = "\
# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
10.244.1.7\ttrainer-host-0.trainer.ml.svc.cluster.local\ttrainer-host-0
# Entries added by HostAliases.
10.0.0.9\tsupervisor.example Supervisor-Alias   # trailing comment
10.0.0.10\tsupervisor.example
not-an-ip\tsupervisor.example
10.0.0.9\tsupervisor.example
";

    #[test]
    fn every_matching_line_in_file_order() {
        assert_eq!(
            lookup(HOSTS, "supervisor.example"),
            [
                "10.0.0.9".parse::<IpAddr>().unwrap(),
                "10.0.0.10".parse().unwrap()
            ]
        );
        assert_eq!(
            lookup(HOSTS, "localhost"),
            [
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
    }

    #[test]
    fn case_and_trailing_dot_do_not_matter() {
        assert_eq!(lookup(HOSTS, "SUPERVISOR-alias.").len(), 1);
        assert_eq!(lookup(HOSTS, "trainer-host-0").len(), 1);
    }

    #[test]
    fn comments_and_unknown_names_give_nothing() {
        assert!(lookup(HOSTS, "comment").is_empty());
        assert!(lookup(HOSTS, "Kubernetes-managed").is_empty());
        assert!(lookup(HOSTS, "nowhere").is_empty());
        assert!(lookup(HOSTS, ".").is_empty());
        assert!(lookup("", "localhost").is_empty());
    }
}
