//! The files a kubelet writes for a pod and mounts into each of its
//! containers: `/etc/hosts`, `/etc/resolv.conf` and `/etc/hostname`.
//!
//! Invariants:
//! 1. The hostname is `spec.hostname`, else the pod name cut to 63
//!    characters (without a trailing `-` or `.`), as Kubernetes does.
//! 2. `/etc/hosts` names the pod's own address with its FQDN (when it has a
//!    subdomain) and hostname, then the `hostAliases`.
//! 3. `resolv.conf` follows `dnsPolicy` (`ClusterFirst` by default:
//!    the cluster DNS address and the namespace's search path), then
//!    `dnsConfig` is merged in.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Pod;

use super::{CLUSTER_DNS_IP, CLUSTER_DOMAIN};
use crate::kubelet::error::{KubeletError, Result};

/// A pod's hostname (invariant 1).
pub(crate) fn hostname(pod: &Pod) -> String {
    if let Some(h) = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
    {
        return h;
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut cut: String = name.chars().take(63).collect();
    while cut.ends_with(['-', '.']) {
        cut.pop();
    }
    cut
}

/// `<hostname>.<subdomain>.<ns>.svc.cluster.local`, when the pod has a
/// subdomain.
pub(crate) fn fqdn(pod: &Pod) -> Option<String> {
    let sub = pod
        .spec
        .as_ref()?
        .subdomain
        .clone()
        .filter(|s| !s.is_empty())?;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    Some(format!("{}.{sub}.{ns}.svc.{CLUSTER_DOMAIN}", hostname(pod)))
}

/// The pod's `/etc/hosts` (invariant 2).
pub(crate) fn hosts(pod: &Pod, ip: Ipv4Addr) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    let host = hostname(pod);
    match fqdn(pod) {
        Some(f) => out.push_str(&format!("{ip}\t{f}\t{host}\n")),
        None => out.push_str(&format!("{ip}\t{host}\n")),
    }
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.clone())
        .unwrap_or_default();
    if !aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.unwrap_or_default();
            if !names.is_empty() {
                out.push_str(&format!("{}\t{}\n", a.ip, names.join("\t")));
            }
        }
    }
    out
}

/// The pod's `/etc/resolv.conf` (invariant 3); `host_resolv` is the
/// machine's, for `dnsPolicy: Default`.
pub(crate) fn resolv_conf(pod: &Pod, host_resolv: &str) -> Result<String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let (mut servers, mut searches, mut options): Resolv = match policy {
        "ClusterFirst" | "ClusterFirstWithHostNet" | "" => (
            vec![CLUSTER_DNS_IP.to_string()],
            vec![
                format!("{ns}.svc.{CLUSTER_DOMAIN}"),
                format!("svc.{CLUSTER_DOMAIN}"),
                CLUSTER_DOMAIN.to_string(),
            ],
            vec![("ndots".into(), Some("5".into()))],
        ),
        "Default" => parse_resolv(host_resolv),
        "None" => (Vec::new(), Vec::new(), Vec::new()),
        other => {
            return Err(KubeletError::PodSpec(format!(
                "spec.dnsPolicy: {other:?} is not ClusterFirst, ClusterFirstWithHostNet, Default or None"
            )));
        }
    };
    if let Some(cfg) = spec.dns_config {
        servers.extend(cfg.nameservers.unwrap_or_default());
        searches.extend(cfg.searches.unwrap_or_default());
        for o in cfg.options.unwrap_or_default() {
            let name = o.name.unwrap_or_default();
            options.retain(|(n, _)| *n != name);
            options.push((name, o.value));
        }
    } else if policy == "None" {
        return Err(KubeletError::PodSpec(
            "spec.dnsConfig: dnsPolicy None needs a dnsConfig with at least one nameserver".into(),
        ));
    }
    let mut out = String::new();
    for s in servers.iter().take(3) {
        out.push_str(&format!("nameserver {s}\n"));
    }
    if !searches.is_empty() {
        out.push_str(&format!("search {}\n", searches.join(" ")));
    }
    if !options.is_empty() {
        let opts: Vec<String> = options
            .iter()
            .map(|(n, v)| match v {
                Some(v) => format!("{n}:{v}"),
                None => n.clone(),
            })
            .collect();
        out.push_str(&format!("options {}\n", opts.join(" ")));
    }
    Ok(out)
}

/// Name servers, search domains and options (`name`, `value`).
type Resolv = (Vec<String>, Vec<String>, Vec<(String, Option<String>)>);

fn parse_resolv(text: &str) -> Resolv {
    let (mut servers, mut searches, mut options) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => servers.extend(words.next().map(str::to_string)),
            Some("search" | "domain") => searches = words.map(str::to_string).collect(),
            Some("options") => {
                for o in words {
                    let (n, v) = match o.split_once(':') {
                        Some((n, v)) => (n.to_string(), Some(v.to_string())),
                        None => (o.to_string(), None),
                    };
                    options.push((n, v));
                }
            }
            _ => {}
        }
    }
    (servers, searches, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn hostname_and_fqdn_follow_the_spec() {
        let p = pod(
            "metadata: {name: w-0, namespace: ml}\nspec: {hostname: host-0, subdomain: w, containers: []}\n",
        );
        assert_eq!(hostname(&p), "host-0");
        assert_eq!(fqdn(&p).as_deref(), Some("host-0.w.ml.svc.cluster.local"));
        let long = format!(
            "metadata: {{name: {}-x}}\nspec: {{containers: []}}\n",
            "a".repeat(62)
        );
        assert_eq!(hostname(&pod(&long)), "a".repeat(62));
        let hosts = hosts(&p, Ipv4Addr::new(10, 244, 0, 5));
        assert!(
            hosts.contains("10.244.0.5\thost-0.w.ml.svc.cluster.local\thost-0\n"),
            "{hosts}"
        );
        assert!(hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
    }

    #[test]
    fn host_aliases_are_listed() {
        let p = pod(
            "metadata: {name: p}\nspec:\n  hostAliases: [{ip: 10.1.2.3, hostnames: [foo, bar]}]\n  containers: []\n",
        );
        assert!(hosts(&p, Ipv4Addr::new(10, 244, 0, 2)).contains("10.1.2.3\tfoo\tbar\n"));
    }

    #[test]
    fn resolv_conf_follows_the_dns_policy() {
        let p = pod("metadata: {name: p, namespace: ml}\nspec: {containers: []}\n");
        assert_eq!(
            resolv_conf(&p, "").unwrap(),
            "nameserver 10.96.0.10\nsearch ml.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
        );
        let p = pod("metadata: {name: p}\nspec: {dnsPolicy: Default, containers: []}\n");
        assert_eq!(
            resolv_conf(&p, "nameserver 1.1.1.1\nsearch corp\n").unwrap(),
            "nameserver 1.1.1.1\nsearch corp\n"
        );
        let p = pod(
            "metadata: {name: p}\nspec:\n  dnsPolicy: None\n  dnsConfig: {nameservers: [9.9.9.9], searches: [a.b], options: [{name: ndots, value: '2'}, {name: edns0}]}\n  containers: []\n",
        );
        assert_eq!(
            resolv_conf(&p, "").unwrap(),
            "nameserver 9.9.9.9\nsearch a.b\noptions ndots:2 edns0\n"
        );
        let p = pod("metadata: {name: p}\nspec: {dnsPolicy: None, containers: []}\n");
        assert!(
            resolv_conf(&p, "")
                .unwrap_err()
                .to_string()
                .contains("spec.dnsConfig")
        );
        let p = pod("metadata: {name: p}\nspec: {dnsPolicy: Sometimes, containers: []}\n");
        assert!(
            resolv_conf(&p, "")
                .unwrap_err()
                .to_string()
                .contains("spec.dnsPolicy")
        );
    }
}
