//! `hostmesh stacks procmesh/NAME [--rank R]`: prints the stacks the
//! operator captured on the ProcMesh's last stall, from ConfigMap
//! `<NAME>-stacks`, through the Kubernetes API only (a user on a real
//! cluster cannot reach the agents).
//!
//! Invariants:
//! 1. Formatting is pure ([`format_stacks`]) and prints the summary first,
//!    then the ranks in rank order (or the one asked for).
//! 2. Text from the API is printed with control characters replaced, so a
//!    proc cannot drive the terminal through its stacks.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use crate::status::{StatusError, Target, parse_target};

/// Arguments of `hostmesh stacks`.
#[derive(Debug, Clone, clap::Args)]
pub struct StacksArgs {
    /// The ProcMesh: `procmesh/NAME` (also `pm/NAME`).
    pub target: String,
    /// Print only this rank's stacks.
    #[arg(long)]
    pub rank: Option<u64>,
    /// Namespace (defaults to the kubeconfig context's namespace).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Kubeconfig file (defaults to KUBECONFIG, then ~/.kube/config, then
    /// in-cluster configuration).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// Errors of `hostmesh stacks`.
#[derive(Debug, thiserror::Error)]
pub enum StacksError {
    /// The target is not a ProcMesh.
    #[error("stacks are kept for ProcMeshes only: give procmesh/NAME, e.g. `procmesh/train`")]
    NotProcMesh,
    /// Reading the cluster failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// No stall was captured (yet).
    #[error(
        "no stacks for ProcMesh {name:?} in namespace {namespace:?}: ConfigMap {configmap:?} does not exist (stacks are captured when a rank stalls, with spec.stallTimeout set)"
    )]
    NoStacks {
        /// The ProcMesh.
        name: String,
        /// Its namespace.
        namespace: String,
        /// The ConfigMap looked for.
        configmap: String,
    },
    /// The rank asked for has no stacks.
    #[error("rank {rank} has no stacks in ConfigMap {configmap:?}; ranks kept: {kept}")]
    NoRank {
        /// The rank.
        rank: u64,
        /// The ConfigMap.
        configmap: String,
        /// The ranks it has.
        kept: String,
    },
}

/// The stacks ConfigMap's data as text (invariants 1-2).
pub fn format_stacks(
    data: &BTreeMap<String, String>,
    rank: Option<u64>,
    configmap: &str,
) -> Result<String, StacksError> {
    let mut ranks: Vec<(u64, &String)> = data
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("rank-")?.parse().ok()?, v)))
        .collect();
    ranks.sort_by_key(|(r, _)| *r);
    let mut out = String::new();
    match rank {
        Some(want) => {
            let Some((_, text)) = ranks.iter().find(|(r, _)| *r == want) else {
                let kept: Vec<String> = ranks.iter().take(20).map(|(r, _)| r.to_string()).collect();
                return Err(StacksError::NoRank {
                    rank: want,
                    configmap: configmap.to_owned(),
                    kept: kept.join(", "),
                });
            };
            out.push_str(&clean(text));
        }
        None => {
            if let Some(s) = data.get("summary") {
                out.push_str(&clean(s));
            }
            for (_, text) in ranks {
                let _ = write!(out, "\n{}", clean(text));
            }
        }
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// Reads the ConfigMap and returns the text to print.
pub async fn run(args: &StacksArgs) -> Result<String, StacksError> {
    let Target::ProcMesh(name) = parse_target(&args.target)? else {
        return Err(StacksError::NotProcMesh);
    };
    let client = crate::status::kube_client(args.kubeconfig.as_deref()).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let configmap = format!("{name}-stacks");
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let cm = api
        .get_opt(&configmap)
        .await
        .map_err(|source| StatusError::Api {
            kind: "ConfigMap",
            name: configmap.clone(),
            source,
        })?
        .ok_or_else(|| StacksError::NoStacks {
            name: name.clone(),
            namespace: namespace.clone(),
            configmap: configmap.clone(),
        })?;
    format_stacks(&cm.data.unwrap_or_default(), args.rank, &configmap)
}

/// `hostmesh stacks`: prints the stacks to stdout.
pub fn run_blocking(args: &StacksArgs) -> Result<(), StacksError> {
    use std::io::Write as _;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StatusError::Config(format!("cannot start the tokio runtime: {e}")))?;
    let text = rt.block_on(run(args))?;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_the_summary_then_ranks_in_order_or_one_rank() {
        let data: BTreeMap<String, String> = [
            ("summary", "captured for a stall of ranks 5\n"),
            ("rank-10", "rank 10 by kernel\nstack ten\n"),
            ("rank-5", "rank 5 by kernel\nstack \x1b[31mfive\n"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        let all = format_stacks(&data, None, "pm-stacks").unwrap();
        let five = all.find("rank 5 by").unwrap();
        assert!(all.starts_with("captured"), "{all}");
        assert!(five < all.find("rank 10 by").unwrap(), "rank order: {all}");
        assert!(!all.contains('\x1b'), "control characters replaced");
        let one = format_stacks(&data, Some(10), "pm-stacks").unwrap();
        assert_eq!(one, "rank 10 by kernel\nstack ten\n");
        let err = format_stacks(&data, Some(3), "pm-stacks")
            .unwrap_err()
            .to_string();
        assert!(err.contains("ranks kept: 5, 10"), "{err}");
    }
}
