//! `spec.dependsOn` as plain data: what a ProcMesh's dependencies say
//! ([`Deps`]), from the ProcMeshes of its namespace.
//!
//! Invariants:
//! 1. A dependency is met when the named ProcMesh, on the same World, has
//!    reached the condition (`Ready`: its `Ready` condition is True or it
//!    has succeeded; `Succeeded`: it has succeeded). A missing one is
//!    waited for (it may be created later).
//! 2. A dependency that failed (phase `Failed`) fails the dependent; one on
//!    another World, or a cycle back to the dependent, is an invalid spec.
//! 3. Once a ProcMesh has spawned in its generation its dependencies are
//!    no longer read (the plan latches on `status.startTime`).

use hostmesh_crds::ProcMesh;
use hostmesh_crds::conditions::{self, FAILED, READY};
use hostmesh_crds::procmesh::{DependencyCondition, ProcMeshPhase};
use kube::ResourceExt as _;

/// What a ProcMesh's dependencies let it do.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Deps {
    /// Every dependency is met (or there is none).
    #[default]
    Met,
    /// Some are not met yet: the `Waiting` condition's message.
    Waiting(String),
    /// A dependency failed: why.
    Failed(String),
    /// The dependencies cannot be met as written: the field and the fix.
    Invalid(String),
}

/// Evaluates `pm`'s dependencies against `all`, the ProcMeshes of its
/// namespace (invariants 1-2).
pub fn evaluate(pm: &ProcMesh, all: &[ProcMesh]) -> Deps {
    if pm.spec.depends_on.is_empty() {
        return Deps::Met;
    }
    let find = |name: &str| all.iter().find(|o| o.name_any() == name);
    if let Some(cycle) = cycle(pm, &find) {
        return Deps::Invalid(format!(
            "spec.dependsOn: the dependencies form a cycle ({}); remove one of them",
            cycle.join(" -> ")
        ));
    }
    let mut waiting = Vec::new();
    for (i, d) in pm.spec.depends_on.iter().enumerate() {
        let Some(dep) = find(&d.name) else {
            waiting.push(format!("ProcMesh {} (not created yet)", d.name));
            continue;
        };
        if dep.spec.world != pm.spec.world {
            return Deps::Invalid(format!(
                "spec.dependsOn[{i}].name: ProcMesh {} runs on World {}, not {}; name a ProcMesh of the same World",
                d.name, dep.spec.world, pm.spec.world
            ));
        }
        let status = dep.status.as_ref();
        let phase = status.and_then(|s| s.phase);
        match phase {
            Some(ProcMeshPhase::Failed) => {
                let why = status
                    .and_then(|s| conditions::get(&s.conditions, FAILED))
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                return Deps::Failed(format!("dependency ProcMesh {} failed: {why}", d.name));
            }
            Some(ProcMeshPhase::Succeeded) => continue,
            _ => {}
        }
        let ready = status.is_some_and(|s| conditions::is_true(&s.conditions, READY));
        if d.condition == DependencyCondition::Ready && ready {
            continue;
        }
        let now = phase.map_or("-", |p| p.as_str());
        waiting.push(format!(
            "ProcMesh {} to be {:?} (it is {now})",
            d.name, d.condition
        ));
    }
    if waiting.is_empty() {
        Deps::Met
    } else {
        Deps::Waiting(format!("waiting for {}", waiting.join(", ")))
    }
}

/// A chain of dependencies from `pm` back to itself, if there is one.
fn cycle<'a>(pm: &'a ProcMesh, find: &dyn Fn(&str) -> Option<&'a ProcMesh>) -> Option<Vec<String>> {
    let me = pm.name_any();
    // Depth-first over the names, each visited once.
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<(String, Vec<String>)> = pm
        .spec
        .depends_on
        .iter()
        .map(|d| (d.name.clone(), vec![me.clone(), d.name.clone()]))
        .collect();
    while let Some((name, path)) = stack.pop() {
        if name == me {
            return Some(path);
        }
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some(next) = find(&name) {
            for d in &next.spec.depends_on {
                let mut p = path.clone();
                p.push(d.name.clone());
                stack.push((d.name.clone(), p));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk(name: &str, world: &str, deps: &str, phase: Option<&str>, ready: bool) -> ProcMesh {
        let status = match phase {
            Some(p) => format!(
                "\nstatus: {{phase: {p}, conditions: [{{type: Ready, status: '{}', reason: x, message: '', lastTransitionTime: '2026-01-01T00:00:00Z'}}, {{type: Failed, status: '{}', reason: x, message: 'rank 0 exited with code 1', lastTransitionTime: '2026-01-01T00:00:00Z'}}]}}",
                if ready { "True" } else { "False" },
                if p == "Failed" { "True" } else { "False" },
            ),
            None => String::new(),
        };
        serde_saphyr::from_str(&format!(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}, namespace: ns}}\n\
             spec: {{world: {world}, command: [sh], dependsOn: [{deps}]}}{status}\n"
        ))
        .unwrap()
    }

    #[test]
    fn waits_then_is_met_then_fails_with_its_dependency() {
        let train = mk("train", "w", "{name: fetch}", None, false);
        assert_eq!(
            evaluate(&train, std::slice::from_ref(&train)),
            Deps::Waiting("waiting for ProcMesh fetch (not created yet)".into())
        );
        let running = mk("fetch", "w", "", Some("Running"), true);
        let Deps::Waiting(m) = evaluate(&train, &[train.clone(), running.clone()]) else {
            panic!()
        };
        assert_eq!(
            m,
            "waiting for ProcMesh fetch to be Succeeded (it is Running)"
        );
        let on_ready = mk("train", "w", "{name: fetch, condition: Ready}", None, false);
        assert_eq!(evaluate(&on_ready, &[running]), Deps::Met);
        let done = mk("fetch", "w", "", Some("Succeeded"), false);
        assert_eq!(evaluate(&train, std::slice::from_ref(&done)), Deps::Met);
        assert_eq!(
            evaluate(&on_ready, &[done]),
            Deps::Met,
            "Succeeded is Ready enough"
        );
        let failed = mk("fetch", "w", "", Some("Failed"), false);
        assert_eq!(
            evaluate(&train, &[failed]),
            Deps::Failed("dependency ProcMesh fetch failed: rank 0 exited with code 1".into())
        );
    }

    #[test]
    fn another_world_and_cycles_are_invalid() {
        let train = mk("train", "w", "{name: fetch}", None, false);
        let elsewhere = mk("fetch", "other", "", Some("Succeeded"), false);
        let Deps::Invalid(m) = evaluate(&train, &[elsewhere]) else {
            panic!()
        };
        assert!(
            m.starts_with("spec.dependsOn[0].name: ProcMesh fetch runs on World other"),
            "{m}"
        );
        let a = mk("a", "w", "{name: b}", None, false);
        let b = mk("b", "w", "{name: c}", None, false);
        let c = mk("c", "w", "{name: a}", None, false);
        let Deps::Invalid(m) = evaluate(&a, &[a.clone(), b, c]) else {
            panic!()
        };
        assert!(m.contains("a -> b -> c -> a"), "{m}");
        let own = mk("a", "w", "{name: a}", None, false);
        assert!(matches!(
            evaluate(&own, std::slice::from_ref(&own)),
            Deps::Invalid(_)
        ));
    }
}
