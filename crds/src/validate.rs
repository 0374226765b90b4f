//! Validation the schema cannot express, as pure functions over specs.
//! Every [`FieldError`] names the field (`spec.shape[1].name`) and says how
//! to fix it.

use std::collections::HashSet;
use std::time::Duration;

use crate::duration;
use crate::procmesh::{self, ProcMeshSpec};
use crate::world::{self, WorldSpec};
use hostmesh_mesh::shape::{Dim, MAX_DIM_SIZE, MAX_DIMS};

pub use crate::field::{FieldError, join};

/// Whether `s` is a DNS label (RFC 1123, lower case, starts with a letter).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

fn check_dims(path: &str, dims: &[Dim], errs: &mut Vec<FieldError>) {
    if dims.len() > MAX_DIMS {
        errs.push(FieldError::new(
            path,
            format!("has {} dimensions; use at most {MAX_DIMS}", dims.len()),
        ));
    }
    let mut seen = HashSet::new();
    for (i, d) in dims.iter().enumerate() {
        if !is_dns_label(&d.name) {
            errs.push(FieldError::new(
                format!("{path}[{i}].name"),
                format!("{:?} is not a DNS label; use lower-case letters, digits and '-', starting with a letter (e.g. \"host\")", d.name),
            ));
        }
        if !seen.insert(d.name.as_str()) {
            errs.push(FieldError::new(
                format!("{path}[{i}].name"),
                format!(
                    "dimension {:?} appears twice; give each dimension its own name",
                    d.name
                ),
            ));
        }
        if d.size == 0 || d.size > MAX_DIM_SIZE {
            errs.push(FieldError::new(
                format!("{path}[{i}].size"),
                format!(
                    "{} is out of range; use a size from 1 to {MAX_DIM_SIZE}",
                    d.size
                ),
            ));
        }
    }
}

/// Parsed timing settings of a World.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorldTimings {
    /// `spec.healthTimeout`.
    pub health_timeout: Duration,
    /// `spec.evictionTimeout`.
    pub eviction_timeout: Duration,
    /// `spec.failurePolicy.backoff`.
    pub backoff: Duration,
    /// `spec.failurePolicy.maxBackoff`.
    pub max_backoff: Duration,
    /// `spec.agent.heartbeatInterval`.
    pub heartbeat_interval: Duration,
}

/// Default `spec.agent.heartbeatInterval`.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// Validates a World named `name`; returns its parsed timings when valid.
pub fn world(name: &str, spec: &WorldSpec) -> Result<WorldTimings, Vec<FieldError>> {
    let mut errs = Vec::new();
    match (spec.shape.is_empty(), spec.hosts) {
        (true, None) => errs.push(FieldError::new(
            "spec.shape",
            "is empty; give the World's dimensions, e.g. [{name: host, size: 4}], or set spec.hosts",
        )),
        (false, Some(_)) => errs.push(FieldError::new(
            "spec.hosts",
            "is set together with spec.shape; keep only one of them",
        )),
        _ => {}
    }
    check_dims("spec.shape", &spec.shape, &mut errs);
    if spec.hosts == Some(0) {
        errs.push(FieldError::new(
            "spec.hosts",
            "is 0; a World needs at least 1 host",
        ));
    }
    let shape = spec.full_shape();
    let n = shape.num_ranks();
    if n > world::MAX_HOSTS {
        let sizes: Vec<String> = shape.dims().iter().map(|d| d.size.to_string()).collect();
        // The product saturates: say what was asked, not u64::MAX.
        let count = match shape
            .dims()
            .iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(u64::from(d.size)))
        {
            Some(total) => total.to_string(),
            None => "more than 2^64".to_string(),
        };
        errs.push(FieldError::new(
            "spec.shape",
            format!(
                "asks for {} = {count} hosts; a World has at most {}, split it into several Worlds",
                sizes.join(" x "),
                world::MAX_HOSTS
            ),
        ));
    }
    // The World names a headless Service: an RFC 1035 label (a letter
    // first). Pod names `<world>-host-<rank>` are hostnames: at most 63.
    let longest = format!("{name}-host-{}", n.min(world::MAX_HOSTS).saturating_sub(1));
    if !is_dns_label(name) {
        errs.push(FieldError::new(
            "metadata.name",
            format!("{name:?} is not an RFC 1035 label: the World names a headless Service, so use lower-case letters, digits and '-', starting with a letter and ending with a letter or digit"),
        ));
    } else if longest.len() > 63 {
        errs.push(FieldError::new(
            "metadata.name",
            format!("{name:?} makes host pod names like {longest:?}, longer than the 63 characters of a hostname; use a shorter name"),
        ));
    }
    for (i, t) in spec
        .scheduling
        .iter()
        .flat_map(|s| s.topology.iter())
        .enumerate()
    {
        let field = format!("spec.scheduling.topology[{i}]");
        if !shape.dims().iter().any(|d| d.name == t.dimension) {
            let names: Vec<&str> = shape.dims().iter().map(|d| d.name.as_str()).collect();
            errs.push(FieldError::new(
                format!("{field}.dimension"),
                format!(
                    "{:?} is not a dimension of the World; use one of {}",
                    t.dimension,
                    names.join(", ")
                ),
            ));
        }
        let name = t.key.rsplit('/').next().unwrap_or_default();
        let prefix_ok = match t.key.split_once('/') {
            None => true,
            Some((prefix, rest)) => {
                !rest.contains('/')
                    && !prefix.is_empty()
                    && prefix.len() <= 253
                    && prefix.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.')
                    })
            }
        };
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !prefix_ok || !name_ok {
            errs.push(FieldError::new(
                format!("{field}.key"),
                format!(
                    "{:?} is not a node label key; use one such as topology.kubernetes.io/rack",
                    t.key
                ),
            ));
        }
    }
    let pod = spec.template.spec.as_ref();
    let containers = pod.map(|p| p.containers.as_slice()).unwrap_or_default();
    if containers.is_empty() {
        errs.push(FieldError::new(
            "spec.template.spec.containers",
            "is empty; give the host container, e.g. [{name: host, image: ...}]",
        ));
    }
    for (i, c) in containers.iter().enumerate() {
        if c.image.as_deref().unwrap_or("").is_empty() {
            errs.push(FieldError::new(
                format!("spec.template.spec.containers[{i}].image"),
                "is missing; set the container image",
            ));
        }
    }
    if spec.port == 0 || spec.port == 26601 {
        errs.push(FieldError::new(
            "spec.port",
            format!("{} cannot be used (26601 is the agent's health port); pick another port such as 26602", spec.port),
        ));
    }
    if let Some(m) = &spec.monarch {
        errs.extend(crate::monarch::check(name, m, spec.port));
    }
    if let Some(ttl) = spec.ttl_seconds_after_finished
        && ttl < 0
    {
        errs.push(FieldError::new(
            "spec.ttlSecondsAfterFinished",
            format!("{ttl} is negative; use 0 (delete as soon as it finished) or more, or leave it unset to keep the World"),
        ));
    }
    check_deadline(
        "spec.readyDeadlineSeconds",
        spec.ready_deadline_seconds,
        &mut errs,
    );
    for (i, r) in spec.failure_policy.rules.iter().enumerate() {
        let field = format!("spec.failurePolicy.rules[{i}]");
        let matches_nothing = r.exit_codes.is_empty()
            && r.signals.is_empty()
            && r.reasons.is_empty()
            && r.causes.is_empty()
            && r.stderr_pattern.is_none();
        check_rule(
            &field,
            matches_nothing,
            r.stderr_pattern.as_deref(),
            &mut errs,
        );
        if let Some(t) = r.unschedulable_for.as_deref() {
            if let Err(e) = duration::parse(&format!("{field}.unschedulableFor"), t) {
                errs.push(e);
            }
            if !r.reasons.contains(&world::HostReason::Unschedulable) {
                errs.push(FieldError::new(
                    format!("{field}.unschedulableFor"),
                    "is set without reason Unschedulable; add Unschedulable to reasons or remove unschedulableFor",
                ));
            }
        }
    }
    if let Some(m) = &spec.update_policy.max_unavailable {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let field = "spec.updatePolicy.maxUnavailable";
        match m {
            IntOrString::Int(n) if *n < 1 => errs.push(FieldError::new(
                field,
                format!("{n} would stop the update; use at least 1 (or a percentage such as \"25%\")"),
            )),
            IntOrString::String(p)
                if p.strip_suffix('%').and_then(|n| n.parse::<u32>().ok()).is_none_or(|n| n == 0 || n > 100) =>
            {
                errs.push(FieldError::new(
                    field,
                    format!("{p:?} is not a percentage from 1% to 100%; write one such as \"25%\", or a number of hosts"),
                ))
            }
            _ => {}
        }
        if spec.update_policy.type_ != world::UpdateType::RollingUpdate {
            errs.push(FieldError::new(
                field,
                format!(
                    "is set with type {:?}; it only applies to RollingUpdate",
                    spec.update_policy.type_
                ),
            ));
        }
    }
    if let Some(scope) = &spec.failure_policy.scope {
        check_scope("spec.failurePolicy.scope", scope, &shape, &mut errs);
        if spec.failure_policy.action == world::FailureAction::RecreateGang {
            errs.push(FieldError::new(
                "spec.failurePolicy.scope",
                "is set with action RecreateGang, which recreates every host; use action ReplaceHost with a scope, or remove scope",
            ));
        }
    }
    check_deadline(
        "spec.activeDeadlineSeconds",
        spec.active_deadline_seconds,
        &mut errs,
    );
    errs.extend(crate::shm::check(spec));
    let fp = &spec.failure_policy;
    let timings = (|| {
        Ok::<_, FieldError>(WorldTimings {
            health_timeout: duration::parse_or(
                "spec.healthTimeout",
                spec.health_timeout.as_deref(),
                Duration::from_secs(10),
            )?,
            eviction_timeout: duration::parse_or(
                "spec.evictionTimeout",
                spec.eviction_timeout.as_deref(),
                Duration::from_secs(60),
            )?,
            backoff: duration::parse_or(
                "spec.failurePolicy.backoff",
                fp.backoff.as_deref(),
                Duration::from_secs(1),
            )?,
            max_backoff: duration::parse_or(
                "spec.failurePolicy.maxBackoff",
                fp.max_backoff.as_deref(),
                Duration::from_secs(300),
            )?,
            heartbeat_interval: duration::parse_or(
                "spec.agent.heartbeatInterval",
                spec.agent.heartbeat_interval.as_deref(),
                DEFAULT_HEARTBEAT_INTERVAL,
            )?,
        })
    })();
    match timings {
        Ok(t) if errs.is_empty() => {
            if t.health_timeout < Duration::from_secs(1) {
                return Err(vec![FieldError::new(
                    "spec.healthTimeout",
                    "is shorter than 1s, below the agents' heartbeat interval; use at least \"1s\" (default \"10s\")",
                )]);
            }
            let beat = t.heartbeat_interval;
            if spec.agent.heartbeat_interval.is_some() {
                if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&beat) {
                    return Err(vec![FieldError::new(
                        "spec.agent.heartbeatInterval",
                        "is outside 100ms..60s; use about one second per 2,000 hosts (default \"1s\")",
                    )]);
                }
                if t.health_timeout < beat * 2 {
                    return Err(vec![FieldError::new(
                        "spec.healthTimeout",
                        format!(
                            "is shorter than twice spec.agent.heartbeatInterval ({beat:?}): a host would expire between two heartbeats; raise healthTimeout to at least {:?} or shorten the interval",
                            beat * 2
                        ),
                    )]);
                }
            }
            Ok(t)
        }
        Ok(_) => Err(errs),
        Err(e) => {
            errs.push(e);
            Err(errs)
        }
    }
}

/// A failure rule (World or ProcMesh) must match something, and its
/// `stderrPattern` must compile.
fn check_rule(
    field: &str,
    matches_nothing: bool,
    stderr_pattern: Option<&str>,
    errs: &mut Vec<FieldError>,
) {
    if matches_nothing {
        errs.push(FieldError::new(
            field,
            "matches nothing; give exitCodes, signals, reasons, causes or stderrPattern",
        ));
    }
    check_pattern(&format!("{field}.stderrPattern"), stderr_pattern, errs);
}

/// A rule's `stderrPattern` compiles (within the size limit).
fn check_pattern(field: &str, pattern: Option<&str>, errs: &mut Vec<FieldError>) {
    let Some(p) = pattern else {
        return;
    };
    if p.len() > procmesh::MAX_PROGRESS_PATTERN {
        errs.push(FieldError::new(
            field,
            format!(
                "is {} bytes long; use at most {}",
                p.len(),
                procmesh::MAX_PROGRESS_PATTERN
            ),
        ));
    } else if let Err(e) = progress_regex(p) {
        errs.push(FieldError::new(
            field,
            format!("{p:?} is not a valid regular expression ({e}); write one such as \"CUDA error|NCCL\""),
        ));
    }
}

/// A failure scope names a dimension of `shape`.
fn check_scope(field: &str, scope: &str, shape: &hostmesh_mesh::Shape, errs: &mut Vec<FieldError>) {
    if !shape.dims().iter().any(|d| d.name == scope) {
        let names: Vec<&str> = shape.dims().iter().map(|d| d.name.as_str()).collect();
        errs.push(FieldError::new(
            field,
            format!(
                "{scope:?} is not a dimension; use one of {}",
                names.join(", ")
            ),
        ));
    }
}

/// A deadline in seconds is at least 1 and at most a year (366 days).
fn check_deadline(field: &str, secs: Option<i64>, errs: &mut Vec<FieldError>) {
    match secs {
        Some(s) if s < 1 => errs.push(FieldError::new(
            field,
            format!(
                "{s} is not a deadline; give a number of seconds of at least 1, or leave it unset"
            ),
        )),
        Some(s) if s > world::MAX_DEADLINE_SECONDS => errs.push(FieldError::new(
            field,
            format!(
                "{s} is longer than a year; use at most {}",
                world::MAX_DEADLINE_SECONDS
            ),
        )),
        _ => {}
    }
}

/// `spec.successPolicy`: `dims` goes with `Selected` (and only with it),
/// names dimensions of the extent and coordinates inside them.
fn check_success_policy(
    spec: &ProcMeshSpec,
    world: Option<&WorldSpec>,
    errs: &mut Vec<FieldError>,
) {
    use crate::procmesh::SuccessMode;
    let sp = &spec.success_policy;
    let mode = sp.mode();
    if mode == SuccessMode::Selected && sp.dims.is_empty() {
        errs.push(FieldError::new(
            "spec.successPolicy.dims",
            "is empty with policy Selected; select ranks by coordinates, e.g. {replica: 0}, or choose AllRanks, AnyRank or RankZero",
        ));
    }
    if mode != SuccessMode::Selected && !sp.dims.is_empty() {
        errs.push(FieldError::new(
            "spec.successPolicy.dims",
            format!("is given with policy {mode:?}, which selects no ranks by coordinates; remove policy (dims implies Selected) or remove dims"),
        ));
    }
    let Some(w) = world else {
        return;
    };
    let extent = w.full_shape().concat(&spec.per_host_shape());
    for (name, coord) in &sp.dims {
        let field = format!("spec.successPolicy.dims.{name}");
        match extent.dims().iter().find(|d| &d.name == name) {
            None => {
                let names: Vec<&str> = extent.dims().iter().map(|d| d.name.as_str()).collect();
                errs.push(FieldError::new(
                    field,
                    format!(
                        "{name:?} is not a dimension of the ProcMesh's extent; use one of {}",
                        names.join(", ")
                    ),
                ));
            }
            Some(d) if *coord >= d.size => errs.push(FieldError::new(
                field,
                format!(
                    "{coord} is outside dimension {name:?} of size {}; use 0 to {}",
                    d.size,
                    d.size - 1
                ),
            )),
            Some(_) => {}
        }
    }
}

/// Parsed timing settings of a ProcMesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcMeshTimings {
    /// `spec.spawnTimeout`.
    pub spawn_timeout: Duration,
    /// `spec.stopTimeout`.
    pub stop_timeout: Duration,
    /// `spec.restartPolicy.backoff`.
    pub backoff: Duration,
    /// `spec.stallTimeout`; `None`: stall detection is off.
    pub stall_timeout: Option<Duration>,
}

/// The command, its arguments and its environment must fit what the agent
/// can `execve` (each string at most [`procmesh::MAX_ARG_BYTES`]) and leave
/// the object room for its status ([`procmesh::MAX_COMMAND_BYTES`] in all).
fn check_command_sizes(spec: &ProcMeshSpec, errs: &mut Vec<FieldError>) {
    let strings = spec
        .command
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("spec.command[{i}]"), s.len()))
        .chain(
            spec.args
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("spec.args[{i}]"), s.len())),
        )
        .chain(
            spec.env
                .iter()
                .enumerate()
                .map(|(i, e)| (format!("spec.env[{i}]"), e.name.len() + 1 + e.value.len())),
        );
    let mut total = 0usize;
    for (field, len) in strings {
        total = total.saturating_add(len);
        if len > procmesh::MAX_ARG_BYTES {
            errs.push(FieldError::new(
                field,
                format!(
                    "Too long: {len} bytes; one argument or variable (NAME=value) may have at most {} bytes (Linux's execve limit); pass large data in a file or a ConfigMap",
                    procmesh::MAX_ARG_BYTES
                ),
            ));
        }
    }
    if total > procmesh::MAX_COMMAND_BYTES {
        errs.push(FieldError::new(
            "spec.command",
            format!(
                "Too long: command, args and env take {total} bytes together; use at most {} (pass large data in a file or a ConfigMap)",
                procmesh::MAX_COMMAND_BYTES
            ),
        ));
    }
}

/// [`proc_mesh`], and the ProcMesh's name: its procs' names
/// (`<name>.<uid>-<hash>.<rank>`) must fit the agent's limit for the largest
/// rank this mesh has on `world` ([`procmesh::max_name`]).
pub fn proc_mesh_named(
    name: &str,
    spec: &ProcMeshSpec,
    world: Option<&WorldSpec>,
) -> Result<ProcMeshTimings, Vec<FieldError>> {
    let checked = proc_mesh(spec, world);
    let name_err = world.and_then(|w| {
        let total = w
            .full_shape()
            .num_ranks()
            .saturating_mul(spec.per_host_shape().num_ranks());
        let largest = total.clamp(1, procmesh::MAX_PROCS) - 1;
        let max = procmesh::max_name(largest);
        (name.len() > max).then(|| {
            FieldError::new(
                "metadata.name",
                format!(
                    "Too long: {} bytes; a ProcMesh of {total} procs may have a name of at most {max} bytes, since its proc names ({name}.<uid>-<hash>.<rank>) may have at most {} (the agent's limit); use a shorter name",
                    name.len(),
                    procmesh::MAX_PROC_NAME
                ),
            )
        })
    });
    match (checked, name_err) {
        (r, None) => r,
        (Ok(_), Some(e)) => Err(vec![e]),
        (Err(mut errs), Some(e)) => {
            errs.insert(0, e);
            Err(errs)
        }
    }
}

/// `spec.stallTimeout` must be long enough to mean something, and
/// `spec.progressPattern` must compile (within its size limit) and have a
/// timeout to serve.
fn check_progress(spec: &ProcMeshSpec, errs: &mut Vec<FieldError>) {
    if let Some(t) = spec.stall_timeout.as_deref()
        && let Ok(d) = duration::parse("spec.stallTimeout", t)
        && d < MIN_STALL_TIMEOUT
    {
        errs.push(FieldError::new(
            "spec.stallTimeout",
            format!("{t:?} is shorter than 1s; use at least \"1s\" (a training step usually takes far longer)"),
        ));
    }
    let Some(p) = spec.progress_pattern.as_deref() else {
        return;
    };
    if spec.stall_timeout.is_none() {
        errs.push(FieldError::new(
            "spec.progressPattern",
            "is set without spec.stallTimeout; set stallTimeout (e.g. \"10m\") or remove progressPattern",
        ));
    }
    if p.len() > procmesh::MAX_PROGRESS_PATTERN {
        errs.push(FieldError::new(
            "spec.progressPattern",
            format!(
                "is {} bytes long; use at most {}",
                p.len(),
                procmesh::MAX_PROGRESS_PATTERN
            ),
        ));
        return;
    }
    if let Err(e) = progress_regex(p) {
        errs.push(FieldError::new(
            "spec.progressPattern",
            format!(
                "{p:?} is not a valid regular expression ({e}); write one such as \"^step [0-9]+\""
            ),
        ));
    }
}

/// Shortest `spec.stallTimeout`.
pub const MIN_STALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Compiles a `progressPattern` the way the agent does (bounded size).
pub fn progress_regex(p: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(p)
        .size_limit(procmesh::PROGRESS_PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::Syntax(s) => s.lines().last().unwrap_or_default().trim().to_string(),
            regex::Error::CompiledTooBig(n) => {
                format!("it compiles to more than {n} bytes; simplify it")
            }
            other => other.to_string(),
        })
}

/// Validates a ProcMesh against its World's spec (`None`: not found).
pub fn proc_mesh(
    spec: &ProcMeshSpec,
    world: Option<&WorldSpec>,
) -> Result<ProcMeshTimings, Vec<FieldError>> {
    let mut errs = Vec::new();
    match world {
        None => errs.push(FieldError::new(
            "spec.world",
            format!(
                "World {:?} does not exist in this namespace; create it or fix the name",
                spec.world
            ),
        )),
        Some(w) => {
            let world_dims = w.full_shape();
            for (i, d) in spec.per_host.iter().enumerate() {
                if world_dims.dims().iter().any(|wd| wd.name == d.name) {
                    errs.push(FieldError::new(
                        format!("spec.perHost[{i}].name"),
                        format!("{:?} is also a dimension of World {:?}; rename the per-host dimension (e.g. \"gpu\")", d.name, spec.world),
                    ));
                }
            }
        }
    }
    check_dims("spec.perHost", &spec.per_host, &mut errs);
    let per_host = spec.per_host_shape().num_ranks();
    if per_host > procmesh::MAX_PROCS_PER_HOST {
        errs.push(FieldError::new(
            "spec.perHost",
            format!(
                "asks for {per_host} procs per host; use at most {}",
                procmesh::MAX_PROCS_PER_HOST
            ),
        ));
    }
    if let Some(w) = world {
        let total = w.full_shape().num_ranks().saturating_mul(per_host);
        if total > procmesh::MAX_PROCS {
            errs.push(FieldError::new(
                "spec.perHost",
                format!("makes {total} procs in all; a ProcMesh has at most {}, use fewer procs per host", procmesh::MAX_PROCS),
            ));
        }
    }
    if spec.command.first().is_none_or(|c| c.is_empty()) {
        errs.push(FieldError::new(
            "spec.command",
            "is empty; give the program to run, e.g. [python, train.py]",
        ));
    }
    check_command_sizes(spec, &mut errs);
    for (i, e) in spec.env.iter().enumerate() {
        if e.name.is_empty() || e.name.contains('=') || e.name.contains('\0') {
            errs.push(FieldError::new(
                format!("spec.env[{i}].name"),
                format!(
                    "{:?} is not a valid variable name; use letters, digits and '_'",
                    e.name
                ),
            ));
        }
    }
    for (i, r) in spec.restart_policy.rules.iter().enumerate() {
        let field = format!("spec.restartPolicy.rules[{i}]");
        let matches_nothing = r.exit_codes.is_empty()
            && r.signals.is_empty()
            && r.reasons.is_empty()
            && r.causes.is_empty()
            && r.stderr_pattern.is_none();
        check_rule(
            &field,
            matches_nothing,
            r.stderr_pattern.as_deref(),
            &mut errs,
        );
    }
    check_progress(spec, &mut errs);
    check_deadline(
        "spec.activeDeadlineSeconds",
        spec.active_deadline_seconds,
        &mut errs,
    );
    check_success_policy(spec, world, &mut errs);
    if let Some(scope) = &spec.restart_policy.scope {
        if let Some(w) = world {
            let extent = w.full_shape().concat(&spec.per_host_shape());
            check_scope("spec.restartPolicy.scope", scope, &extent, &mut errs);
        }
        if spec.restart_policy.policy != procmesh::RestartMode::OnFailure {
            errs.push(FieldError::new(
                "spec.restartPolicy.scope",
                format!(
                    "is set with policy {:?}; a scope restarts a slice of ranks on a failure, so use policy OnFailure, or remove scope",
                    spec.restart_policy.policy
                ),
            ));
        }
    }
    let mut named = HashSet::new();
    for (i, d) in spec.depends_on.iter().enumerate() {
        if d.name.is_empty() {
            errs.push(FieldError::new(
                format!("spec.dependsOn[{i}].name"),
                "is empty; name a ProcMesh of the same World",
            ));
        } else if !named.insert(d.name.as_str()) {
            errs.push(FieldError::new(
                format!("spec.dependsOn[{i}].name"),
                format!(
                    "ProcMesh {:?} is named twice; name each dependency once",
                    d.name
                ),
            ));
        }
    }
    let timings = (|| {
        Ok::<_, FieldError>(ProcMeshTimings {
            stall_timeout: spec
                .stall_timeout
                .as_deref()
                .map(|t| duration::parse("spec.stallTimeout", t))
                .transpose()?,
            spawn_timeout: duration::parse_or(
                "spec.spawnTimeout",
                spec.spawn_timeout.as_deref(),
                Duration::from_secs(60),
            )?,
            stop_timeout: duration::parse_or(
                "spec.stopTimeout",
                spec.stop_timeout.as_deref(),
                Duration::from_secs(30),
            )?,
            backoff: duration::parse_or(
                "spec.restartPolicy.backoff",
                spec.restart_policy.backoff.as_deref(),
                Duration::from_secs(1),
            )?,
        })
    })();
    match timings {
        Ok(t) if errs.is_empty() => Ok(t),
        Ok(_) => Err(errs),
        Err(e) => {
            errs.push(e);
            Err(errs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world_spec(yaml: &str) -> WorldSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const OK_WORLD: &str = "shape: [{name: replica, size: 2}, {name: host, size: 2}]\n\
        template: {spec: {containers: [{name: host, image: busybox}]}}\n";

    #[test]
    fn good_world_passes_with_defaults() {
        let t = world("trainer", &world_spec(OK_WORLD)).unwrap();
        assert_eq!(t.health_timeout, Duration::from_secs(10));
        assert_eq!(t.eviction_timeout, Duration::from_secs(60));
        assert_eq!(t.heartbeat_interval, DEFAULT_HEARTBEAT_INTERVAL);
    }

    /// A large World's slower heartbeat needs a `healthTimeout` of at
    /// least twice it; each error names the field and the fix.
    #[test]
    fn a_heartbeat_interval_needs_a_health_timeout_twice_as_long() {
        let with = |extra: &str| world("trainer", &world_spec(&format!("{OK_WORLD}{extra}")));
        let t = with("agent: {heartbeatInterval: 5s}\nhealthTimeout: 30s\n").unwrap();
        assert_eq!(t.heartbeat_interval, Duration::from_secs(5));
        // The default healthTimeout (10s) fits 5s, not 6s.
        assert!(with("agent: {heartbeatInterval: 5s}\n").is_ok());
        let e = with("agent: {heartbeatInterval: 6s}\n").unwrap_err();
        assert_eq!(e[0].field, "spec.healthTimeout");
        assert!(e[0].message.contains("at least 12s"), "{}", e[0].message);
        let e = with("agent: {heartbeatInterval: 2m}\nhealthTimeout: 10m\n").unwrap_err();
        assert_eq!(e[0].field, "spec.agent.heartbeatInterval");
        let e = with("agent: {heartbeatInterval: 50ms}\n").unwrap_err();
        assert_eq!(e[0].field, "spec.agent.heartbeatInterval");
        let e = with("agent: {heartbeatInterval: often}\n").unwrap_err();
        assert_eq!(e[0].field, "spec.agent.heartbeatInterval");
    }

    #[test]
    fn world_errors_name_field_and_fix() {
        let cases = [
            (
                "hosts: 2\nscheduling: {topology: [{dimension: replica, key: topology.kubernetes.io/rack}]}\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.scheduling.topology[0].dimension",
                "use one of host",
            ),
            (
                "hosts: 2\nscheduling: {topology: [{dimension: host, key: 'a b/c'}]}\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.scheduling.topology[0].key",
                "not a node label key",
            ),
            (
                "template: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.shape",
                "spec.hosts",
            ),
            (
                "shape: [{name: Host, size: 2}]\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.shape[0].name",
                "DNS label",
            ),
            (
                "shape: [{name: a, size: 2}, {name: a, size: 2}]\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.shape[1].name",
                "own name",
            ),
            (
                "shape: [{name: a, size: 200}, {name: b, size: 200}]\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.shape",
                "at most",
            ),
            (
                "hosts: 2\ntemplate: {spec: {containers: []}}\n",
                "spec.template.spec.containers",
                "host container",
            ),
            (
                "hosts: 2\ntemplate: {spec: {containers: [{name: h}]}}\n",
                "spec.template.spec.containers[0].image",
                "image",
            ),
            (
                "hosts: 2\nhealthTimeout: soon\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.healthTimeout",
                "e.g.",
            ),
            (
                "hosts: 2\nport: 26601\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.port",
                "26602",
            ),
            (
                "hosts: 2\nmonarch: {port: 26602}\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.monarch.port",
                "26600",
            ),
            (
                "hosts: 2\nmonarch: {meshName: my-mesh}\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.monarch.meshName",
                "lowercase letters and digits",
            ),
            (
                "hosts: 2\nmonarch: {clientSelector: {matchExpressions: [{key: role, operator: Equals, values: [x]}]}}\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.monarch.clientSelector.matchExpressions[0].operator",
                "In, NotIn, Exists or DoesNotExist",
            ),
            (
                "hosts: 2\nttlSecondsAfterFinished: -1\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.ttlSecondsAfterFinished",
                "use 0",
            ),
            (
                "hosts: 2\nreadyDeadlineSeconds: 0\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.readyDeadlineSeconds",
                "at least 1",
            ),
            (
                "hosts: 2\nactiveDeadlineSeconds: 99999999999\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n",
                "spec.activeDeadlineSeconds",
                "longer than a year",
            ),
        ];
        for (yaml, field, fix) in cases {
            let errs = world("w", &world_spec(yaml)).unwrap_err();
            let e = errs
                .iter()
                .find(|e| e.field == field)
                .unwrap_or_else(|| panic!("{field}: {errs:?}"));
            assert!(e.message.contains(fix), "{field}: {}", e.message);
        }
        let errs = world(&"x".repeat(60), &world_spec(OK_WORLD)).unwrap_err();
        assert_eq!(errs[0].field, "metadata.name");
        assert!(
            errs[0].message.contains("63 characters"),
            "{}",
            errs[0].message
        );
        // A name that starts with a digit is a DNS-1123 label but not the
        // RFC 1035 label a Service name must be: say so, not "too long".
        let errs = world("1world", &world_spec(OK_WORLD)).unwrap_err();
        assert_eq!(errs[0].field, "metadata.name");
        assert!(
            errs[0].message.contains("starting with a letter"),
            "{}",
            errs[0].message
        );
        // 8 x 16384 overflows u64: the message says what was asked.
        let dims = (0..8)
            .map(|i| format!("{{name: d{i}, size: 16384}}"))
            .collect::<Vec<_>>()
            .join(", ");
        let yaml = format!(
            "shape: [{dims}]\ntemplate: {{spec: {{containers: [{{name: h, image: x}}]}}}}\n"
        );
        let errs = world("w", &world_spec(&yaml)).unwrap_err();
        let e = errs
            .iter()
            .find(|e| e.field == "spec.shape")
            .expect("shape error");
        assert!(e.message.contains("more than 2^64"), "{}", e.message);
        assert!(!e.message.contains("18446744073709551615"), "{}", e.message);
        let errs = world("w", &world_spec("shape: [{name: a, size: 200}, {name: b, size: 200}]\ntemplate: {spec: {containers: [{name: h, image: x}]}}\n")).unwrap_err();
        assert!(
            errs[0].message.contains("200 x 200 = 40000 hosts"),
            "{}",
            errs[0].message
        );
    }

    #[test]
    fn proc_mesh_errors() {
        let w = world_spec(OK_WORLD);
        let pm: ProcMeshSpec = serde_saphyr::from_str(
            "world: trainer\nperHost: [{name: host, size: 2}]\ncommand: [sh]\n",
        )
        .unwrap();
        let errs = proc_mesh(&pm, Some(&w)).unwrap_err();
        assert_eq!(errs[0].field, "spec.perHost[0].name");
        assert!(errs[0].message.contains("also a dimension"));
        let errs = proc_mesh(&pm, None).unwrap_err();
        assert_eq!(errs[0].field, "spec.world");
        assert!(errs[0].message.contains("does not exist"));
        let pm: ProcMeshSpec = serde_saphyr::from_str(
            "world: t\nperHost: [{name: gpu, size: 2}]\ncommand: ['']\nrestartPolicy: {rules: [{action: Retry}]}\n",
        )
        .unwrap();
        let errs = proc_mesh(&pm, Some(&w)).unwrap_err();
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.command", "spec.restartPolicy.rules[0]"]);
        assert!(
            errs[1].message.contains("stderrPattern"),
            "{}",
            errs[1].message
        );
        let pm: ProcMeshSpec =
            serde_saphyr::from_str("world: t\nperHost: [{name: gpu, size: 8}]\ncommand: [sh]\n")
                .unwrap();
        let t = proc_mesh(&pm, Some(&w)).unwrap();
        assert_eq!(t.stop_timeout, Duration::from_secs(30));
    }

    #[test]
    fn stall_settings_are_parsed_and_bad_ones_name_the_field() {
        let w = world_spec(OK_WORLD);
        let spec = |extra: &str| -> ProcMeshSpec {
            serde_saphyr::from_str(&format!("world: t\ncommand: [sh]\n{extra}")).unwrap()
        };
        let t = proc_mesh(&spec(""), Some(&w)).unwrap();
        assert_eq!(t.stall_timeout, None, "off when unset");
        let t = proc_mesh(
            &spec("stallTimeout: 2s\nprogressPattern: '^step [0-9]+'\n"),
            Some(&w),
        )
        .unwrap();
        assert_eq!(t.stall_timeout, Some(Duration::from_secs(2)));
        let cases = [
            ("stallTimeout: 2x\n", "spec.stallTimeout", "not a duration"),
            ("stallTimeout: 100ms\n", "spec.stallTimeout", "at least"),
            (
                "stallTimeout: 2s\nprogressPattern: 'step ('\n",
                "spec.progressPattern",
                "not a valid regular expression",
            ),
            (
                "progressPattern: step\n",
                "spec.progressPattern",
                "without spec.stallTimeout",
            ),
            (
                "stallTimeout: 2s\nprogressPattern: 'a{1000}{1000}'\n",
                "spec.progressPattern",
                "simplify",
            ),
        ];
        for (extra, field, words) in cases {
            let errs = proc_mesh(&spec(extra), Some(&w)).unwrap_err();
            let e = errs
                .iter()
                .find(|e| e.field == field)
                .unwrap_or_else(|| panic!("{extra}: {errs:?}"));
            assert!(e.message.contains(words), "{extra}: {}", e.message);
        }
    }
    /// Issue 30: names and sizes the agent cannot take are refused naming
    /// the field and the limit, computed for the mesh's largest rank.
    #[test]
    fn proc_mesh_names_and_command_sizes_the_agent_cannot_take() {
        let w = world_spec(OK_WORLD);
        let total = w.full_shape().num_ranks() * 8;
        let spec: ProcMeshSpec =
            serde_saphyr::from_str("world: t\nperHost: [{name: gpu, size: 8}]\ncommand: [sh]\n")
                .unwrap();
        let max = procmesh::max_name(total - 1);
        assert_eq!(
            max,
            procmesh::MAX_PROC_NAME - procmesh::PROC_NAME_OVERHEAD - (total - 1).to_string().len()
        );
        assert!(proc_mesh_named(&"a".repeat(max), &spec, Some(&w)).is_ok());
        let errs = proc_mesh_named(&"a".repeat(max + 1), &spec, Some(&w)).unwrap_err();
        assert_eq!(errs[0].field, "metadata.name");
        assert!(
            errs[0].message.contains(&format!("at most {max} bytes"))
                && errs[0].message.contains("128"),
            "{}",
            errs[0].message
        );
        // The largest mesh leaves the least room.
        assert_eq!(procmesh::max_name(procmesh::MAX_PROCS - 1), 103);

        let big = |n: usize| "x".repeat(n);
        let mut spec2 = spec.clone();
        spec2.args = vec![big(procmesh::MAX_ARG_BYTES + 1)];
        let errs = proc_mesh(&spec2, Some(&w)).unwrap_err();
        assert_eq!(errs[0].field, "spec.args[0]");
        assert!(errs[0].message.contains("131071"), "{}", errs[0].message);
        let mut spec3 = spec.clone();
        spec3.args = (0..3).map(|_| big(100_000)).collect();
        let errs = proc_mesh(&spec3, Some(&w)).unwrap_err();
        assert_eq!(errs[0].field, "spec.command");
        assert!(errs[0].message.contains("262144"), "{}", errs[0].message);
        let mut spec4 = spec.clone();
        spec4.args = vec![big(100_000)];
        assert!(proc_mesh(&spec4, Some(&w)).is_ok());
    }

    #[test]
    fn success_policy_and_deadline_errors_name_the_field() {
        let w = world_spec(OK_WORLD);
        let spec = |extra: &str| -> ProcMeshSpec {
            serde_saphyr::from_str(&format!(
                "world: t\nperHost: [{{name: gpu, size: 2}}]\ncommand: [sh]\n{extra}"
            ))
            .unwrap()
        };
        for ok in [
            "",
            "successPolicy: {policy: RankZero}\n",
            "successPolicy: {dims: {replica: 1, gpu: 0}}\n",
            "successPolicy: {policy: Selected, dims: {host: 1}}\n",
            "activeDeadlineSeconds: 60\n",
        ] {
            proc_mesh(&spec(ok), Some(&w)).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
        }
        let cases = [
            (
                "successPolicy: {policy: Selected}\n",
                "spec.successPolicy.dims",
                "is empty",
            ),
            (
                "successPolicy: {policy: AnyRank, dims: {gpu: 0}}\n",
                "spec.successPolicy.dims",
                "remove",
            ),
            (
                "successPolicy: {dims: {node: 0}}\n",
                "spec.successPolicy.dims.node",
                "use one of replica, host, gpu",
            ),
            (
                "successPolicy: {dims: {gpu: 2}}\n",
                "spec.successPolicy.dims.gpu",
                "use 0 to 1",
            ),
            (
                "activeDeadlineSeconds: 0\n",
                "spec.activeDeadlineSeconds",
                "at least 1",
            ),
        ];
        for (extra, field, words) in cases {
            let errs = proc_mesh(&spec(extra), Some(&w)).unwrap_err();
            let e = errs
                .iter()
                .find(|e| e.field == field)
                .unwrap_or_else(|| panic!("{extra}: {errs:?}"));
            assert!(e.message.contains(words), "{extra}: {}", e.message);
        }
    }
}
