//! Starting containers: fetching what a pod refers to (secrets, config
//! maps, service account tokens), preparing its volumes, building each
//! container's launch, spawning it, and scheduling its probes.

use super::*;

/// An ephemeral container as the container it runs as (the same fields
/// but `targetContainerName`, which names the container whose processes
/// it should see: every pod's processes are visible here, as there are no
/// PID namespaces).
fn ephemeral_as_container(
    ec: &k8s_openapi::api::core::v1::EphemeralContainer,
) -> Option<k8s_openapi::api::core::v1::Container> {
    let mut v = serde_json::to_value(ec).ok()?;
    v.as_object_mut()?.remove("targetContainerName");
    serde_json::from_value(v).ok()
}

/// Where the API server's admission mounts the service account volume.
const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl Worker {
    /// Fetches the secrets and config maps the pod refers to, and with
    /// `tokens` the service account tokens its projected volumes ask for.
    pub(super) async fn fetch_lookups(&self, tokens: bool) -> Result<Lookups> {
        let (secrets, cms) = referenced_objects(&self.pod);
        let client = self.shared.client.clone();
        let secret_api: Api<Secret> = Api::namespaced(client.clone(), &self.ns);
        let cm_api: Api<ConfigMap> = Api::namespaced(client, &self.ns);
        let mut lookups = Lookups::default();
        for name in secrets {
            let got = bounded(
                || format!("get secret {}/{name}", self.ns),
                secret_api.get_opt(&name),
            )
            .await?;
            lookups.secrets.insert(name, got);
        }
        for name in cms {
            let got = bounded(
                || format!("get configmap {}/{name}", self.ns),
                cm_api.get_opt(&name),
            )
            .await?;
            lookups.config_maps.insert(name, got);
        }
        for spec in token_specs(&self.pod).into_iter().filter(|_| tokens) {
            let token = self.request_token(&spec).await;
            lookups.tokens.insert(token_key(&spec), token);
        }
        Ok(lookups)
    }

    /// Asks the API server for a token of the pod's service account (what
    /// a projected `serviceAccountToken` source holds); `None` when it will
    /// not issue one.
    pub(super) async fn request_token(&self, spec: &TokenSpec) -> Option<String> {
        let sa = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request: TokenRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": if spec.audience.is_empty() { vec![] } else { vec![spec.audience.clone()] },
                "expirationSeconds": spec.expiration_seconds.unwrap_or(3600),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
            },
        }))
        .ok()?;
        let api: Api<ServiceAccount> = Api::namespaced(self.shared.client.clone(), &self.ns);
        let params = PostParams::default();
        let call = api.create_token_request(&sa, &params, &request);
        match bounded(
            || format!("token for serviceaccount {}/{sa}", self.ns),
            call,
        )
        .await
        {
            Ok(r) => r.status.map(|s| s.token),
            Err(e) => {
                tracing::warn!(pod = %self.key(), serviceaccount = %sa, error = %e, "no service account token; the projected token file stays empty");
                None
            }
        }
    }

    pub(super) async fn prepare(&mut self) -> Result<BTreeMap<String, PathBuf>> {
        // Volumes hold tokens: 0700, under the 0700 `pods` directory.
        crate::kubelet::handle::private(&self.dir)?;
        self.ensure_sandbox().await?;
        let lookups = self.fetch_lookups(true).await?;
        let vol_dir = self.dir.join("volumes");
        std::fs::create_dir_all(self.dir.join("logs"))
            .map_err(|e| KubeletError::io("cannot create", self.dir.join("logs"), e))?;
        let volumes = prepare_volumes(&self.pod, &vol_dir, &lookups, &self.facts())?;
        self.lookups = lookups;
        Ok(volumes)
    }

    pub(super) fn container_spec(&self, i: usize) -> Option<k8s_openapi::api::core::v1::Container> {
        let spec = self.pod.spec.as_ref()?;
        if i < self.n_init {
            spec.init_containers.as_ref()?.get(i).cloned()
        } else if i < self.n_init + self.n_main {
            spec.containers.get(i - self.n_init).cloned()
        } else {
            let name = &self.slots.get(i)?.ctr.name;
            let ec = spec
                .ephemeral_containers
                .as_ref()?
                .iter()
                .find(|c| &c.name == name)?;
            ephemeral_as_container(ec)
        }
    }

    pub(super) fn build_launch(
        &self,
        i: usize,
    ) -> Result<(Launch, k8s_openapi::api::core::v1::Container)> {
        let slot = &self.slots[i];
        let container = self.container_spec(i).ok_or_else(|| {
            KubeletError::PodSpec(format!(
                "{}: container disappeared from the spec",
                slot.field
            ))
        })?;
        let name = &container.name;
        let dns_label = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !dns_label {
            return Err(KubeletError::PodSpec(format!(
                "{}.name: {name:?} must be a DNS label (lowercase letters, digits, '-')",
                slot.field
            )));
        }
        if slot.init && container.restart_policy.as_deref() == Some("Always") {
            return Err(KubeletError::PodSpec(format!(
                "{}.restartPolicy: sidecar init containers (restartPolicy: Always) are not supported by the process kubelet; make it a regular container",
                slot.field
            )));
        }
        let env = resolve_env(
            &self.pod,
            &container,
            &slot.field,
            &self.facts(),
            &self.lookups,
        )?;
        let mut all = launch::service_env(self.api_address().as_ref());
        all.extend(env);
        let env = all;
        let volumes = self.volumes.clone().unwrap_or_default();
        let mut launch = launch::build(
            &self.pod,
            &container,
            &slot.field,
            &self.shared.images,
            env,
            &volumes,
        )?;
        if !process::is_root() {
            // Without mount namespaces the API credentials the server adds
            // to every pod cannot appear at their path; the container runs
            // without them rather than not at all.
            let before = launch.mounts.len();
            launch
                .mounts
                .retain(|m| m.target != std::path::Path::new(SERVICE_ACCOUNT_MOUNT));
            if launch.mounts.len() != before {
                tracing::debug!(pod = %self.key(), container = %container.name, "not root: the service account volume is not mounted");
            }
        }
        if !launch.mounts.is_empty() && !process::is_root() {
            return Err(KubeletError::PodSpec(format!(
                "{}.volumeMounts: mounting volumes needs a kubelet running as root (mount namespaces)",
                slot.field
            )));
        }
        self.join_sandbox(&mut launch);
        if let Some(copy) = &self.shared.agent_copy {
            copy.place(&launch);
        }
        create_mount_targets(&launch.mounts)?;
        Ok((launch, container))
    }

    pub(super) async fn start(&mut self, i: usize) {
        let now = Instant::now();
        // Environment variables read secrets and config maps as they are now.
        let built = match self.fetch_lookups(false).await {
            Ok(lookups) => {
                self.lookups = lookups;
                self.build_launch(i)
            }
            // The API server is unreachable: start with what was read last
            // (as a kubelet uses its cache), if anything was.
            Err(e @ (KubeletError::Api { .. } | KubeletError::ApiTimeout { .. }))
                if self.volumes.is_some() =>
            {
                tracing::warn!(pod = %self.key(), error = %e, "using the secrets and config maps read before");
                self.build_launch(i)
            }
            Err(e) => Err(e),
        };
        let (launch, container) = match built {
            Ok(v) => v,
            Err(e) => {
                let reason = match e {
                    KubeletError::ImageNotMapped(_) => "ErrImageNeverPull",
                    _ => "CreateContainerConfigError",
                };
                let message = e.to_string();
                let slot = &mut self.slots[i];
                let repeated = matches!(&slot.ctr.run, ContainerRun::Waiting { message: Some(m), .. } if *m == message);
                if repeated {
                    tracing::debug!(pod = %format!("{}/{}", self.ns, self.name), container = %slot.ctr.name, error = %message, "still cannot start container");
                } else {
                    tracing::warn!(pod = %format!("{}/{}", self.ns, self.name), container = %slot.ctr.name, error = %message, "cannot start container");
                    events::emit(&self.shared, &self.pod, true, "Failed", message.clone());
                }
                slot.ctr.run = ContainerRun::waiting(reason, Some(message));
                slot.next_start = Some(now + RETRY);
                return;
            }
        };
        let log = logs::log_path(&self.dir, &self.slots[i].ctr.name, false);
        if self.slots[i].ever_started {
            let previous = logs::log_path(&self.dir, &self.slots[i].ctr.name, true);
            if let Err(e) = std::fs::rename(&log, &previous) {
                tracing::debug!(error = %e, "no log to keep as previous");
            }
            // The new run's log starts afresh (logrotate invariant 2).
            logrotate::remove_rotated(&log, self.shared.config.container_log_max_files);
            self.shared.log_cuts.reset(&log);
        }
        let pod_ip = IpAddr::V4(self.ip);
        let key = self.key();
        let slot = &mut self.slots[i];
        slot.run_id += 1;
        slot.next_start = None;
        if slot.ever_started {
            slot.ctr.restarts += 1;
        }
        slot.ever_started = true;
        let started_at = Timestamp::now();
        // Register under the lock so a concurrent emergency kill sees the group.
        let groups = self.shared.groups.clone();
        let spawned = {
            let mut g = lock(&groups);
            let r = process::spawn(&launch, Output::Log(log), Namespace::New);
            if let Ok(child) = &r
                && let Some(pid) = child.id()
            {
                g.insert(pid as i32);
            }
            r
        };
        match spawned {
            Ok(mut child) => {
                let pid = child.id().map(|p| p as i32).unwrap_or_default();
                tracing::info!(pod = %key, container = %slot.ctr.name, pid, program = %launch.program, "started container");
                events::emit(
                    &self.shared,
                    &self.pod,
                    false,
                    "Started",
                    format!("Started container {} (pid {pid})", slot.ctr.name),
                );
                lock(&self.running).insert(slot.ctr.name.clone());
                lock(&self.targets).insert(
                    slot.ctr.name.clone(),
                    ExecTarget {
                        pid,
                        launch: launch.clone(),
                        pod_ip: self.ip,
                    },
                );
                slot.pgid = Some(pid);
                slot.started = Some(now);
                slot.ctr.run = ContainerRun::Running { pid, started_at };
                let mk = |p: Option<&k8s_openapi::api::core::v1::Probe>,
                          what: &str|
                 -> Option<ProbeState> {
                    let p = p?;
                    let spec = probe::probe_spec_or_invalid(
                        p,
                        &container,
                        &format!("{}.{what}", slot.field),
                        pod_ip,
                        &launch,
                    );
                    Some(ProbeState {
                        next_at: now + spec.initial_delay,
                        spec,
                        successes: 0,
                        failures: 0,
                        in_flight: false,
                    })
                };
                if slot.ephemeral {
                    // Never probed, never ready (invariant 6).
                    slot.startup = None;
                    slot.readiness = None;
                    slot.liveness = None;
                    slot.ctr.started = true;
                    slot.ctr.ready = false;
                } else if slot.init {
                    slot.startup = None;
                    slot.readiness = None;
                    slot.liveness = None;
                    slot.ctr.started = true;
                    slot.ctr.ready = false;
                } else {
                    slot.startup = mk(container.startup_probe.as_ref(), "startupProbe");
                    slot.readiness = mk(container.readiness_probe.as_ref(), "readinessProbe");
                    slot.liveness = mk(container.liveness_probe.as_ref(), "livenessProbe");
                    slot.ctr.started = slot.startup.is_none();
                    slot.ctr.ready = slot.ctr.started && slot.readiness.is_none();
                }
                let tx = self.tx.clone();
                let (init, run_id) = (slot.init, slot.run_id);
                tokio::spawn(async move {
                    if let Ok(status) = child.wait().await {
                        let _ = tx.send(Event::Exited {
                            init,
                            idx: i,
                            run_id,
                            status,
                        });
                    }
                });
            }
            Err(e) => {
                tracing::warn!(pod = %key, container = %slot.ctr.name, error = %e, "container failed to start");
                events::emit(
                    &self.shared,
                    &self.pod,
                    true,
                    "Failed",
                    format!("Error: cannot start container {}: {e}", slot.ctr.name),
                );
                let run = ContainerRun::Terminated {
                    pid: None,
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(format!("failed to start {:?}: {e}", launch.program)),
                    started_at: None,
                    finished_at: Timestamp::now(),
                };
                self.after_exit(i, run, 128);
            }
        }
    }

    pub(super) fn run_probes(&mut self, now: Instant) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(pid) = slot.pgid else { continue };
            // Readiness and liveness wait until the startup probe passed.
            let started = slot.ctr.started;
            for (kind, state) in [
                (ProbeKind::Startup, &mut slot.startup),
                (ProbeKind::Readiness, &mut slot.readiness),
                (ProbeKind::Liveness, &mut slot.liveness),
            ] {
                if started == (kind == ProbeKind::Startup) {
                    continue;
                }
                let Some(state) = state.as_mut() else {
                    continue;
                };
                if state.in_flight || state.next_at > now {
                    continue;
                }
                state.in_flight = true;
                let action = state.spec.action.clone();
                let timeout = state.spec.timeout;
                let tx = self.tx.clone();
                let run_id = slot.run_id;
                tokio::spawn(async move {
                    let result = probe::run(&action, timeout, pid).await;
                    let _ = tx.send(Event::Probed {
                        idx: i,
                        run_id,
                        kind,
                        result,
                    });
                });
            }
        }
    }
}
